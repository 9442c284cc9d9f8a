"""torch's memory functions, with torch's names and meanings, for the shim.

Under a pluggable allocator torch's own ``torch.cuda.memory_stats()``,
``max_memory_allocated()``, ``memory_snapshot()``... raise; after
``npu_lifetime.install("cuda")`` they are routed here (see ``torch_api.py``),
and these work on every device, the simulated runtime included.  The public
name is ``npu_lifetime.memory``.  Statistics use torch's keys where the meaning
is the same ("allocated_bytes.all.current", "active_bytes.all.peak",
"reserved_bytes.all.current", "num_alloc_retries", "num_ooms", ...) plus the
shim's own ("pending_bytes.*": freed blocks waiting for other streams'
events; "waiting_bytes.*": cached blocks reused behind a GPU-side wait;
"events_recorded", "stream_waits", "findings", ...):
``npu_lifetime.shim.stat_meanings()`` explains each.
"""
from __future__ import annotations

from collections import OrderedDict

from . import api
from . import arguments as check
from .state import installed

# the device type each shim runtime serves (cpu: the simulated runtime)
_RUNTIME_DEVICE_TYPES = {"cuda": "cuda", "acl": "npu", "sim": "cpu", "none": "cpu"}


def _device_index(device) -> int:
    """The shim's device index for torch's ``device`` argument: None (the
    current device), an int, a torch.device or a str ("cuda:1")."""
    setup = installed()
    if device is None:
        return _current_index(setup)
    if isinstance(device, str) or type(device).__name__ == "device":
        index = _parsed_index(device, setup)
    else:
        index = check.device(device)
    if setup is not None and setup.device == "cuda":
        import torch

        if index >= torch.cuda.device_count():
            raise ValueError(f"device {index} does not exist: this machine has {torch.cuda.device_count()} cuda "
                             "device(s)")
    return index


def _current_index(setup) -> int:
    if setup is None:
        return 0
    import torch

    module = torch.cuda if setup.device == "cuda" else getattr(torch, "npu")  # noqa: B009 (torch_npu adds it)
    return module.current_device()


def _parsed_index(device, setup) -> int:
    import torch

    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be an index, a torch.device or a str such as 'cuda:0', 'npu:1' or 'cpu', "
                         f"not {device!r}") from None
    expected = setup.device if setup is not None else _RUNTIME_DEVICE_TYPES.get(api.runtime_name(), "cpu")
    if parsed.type != expected:
        if setup is not None:
            where = f"the shim is installed for {expected}: ask for {expected!r}, '{expected}:N' or an index"
        elif expected == "cpu":
            where = ("the shim is not installed for a device (npu_lifetime.install('cuda') or ('npu') does that); "
                     "until then it answers for its simulated runtime: 'cpu' or an index")
        else:
            where = f"the shim runs the {api.runtime_name()} runtime: ask for {expected!r} or an index"
        raise ValueError(f"device {device!r} is a {parsed.type} device; {where}")
    return _current_index(setup) if parsed.index is None else parsed.index


# torch's keys for what the shim never does: it has no max_split_size, so no
# block is "oversize" (torch reports -1 for an unset max_split_size).
_NEVER = {
    **{f"oversize_{kind}.{field}": 0 for kind in ("allocations", "segments")
       for field in ("current", "peak", "allocated", "freed")},
    "max_split_size": -1,
}


def _stats(device) -> dict:
    return {**api.stats(_device_index(device)), **_NEVER}


def memory_stats(device=None) -> "OrderedDict[str, int]":
    """Every statistic of ``device``, flat and sorted, as ``torch.cuda.memory_stats``."""
    return OrderedDict(sorted(_stats(device).items()))


def memory_stats_as_nested_dict(device=None) -> dict:
    """``memory_stats`` nested at the dots, as torch's allocator reports them."""
    nested: dict = {}
    for key, value in _stats(device).items():
        node = nested
        *path, leaf = key.split(".")
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = value
    return nested


def _stat(name: str, device) -> int:
    return api.stats(_device_index(device))[name]


def memory_allocated(device=None) -> int:
    """Bytes of live tensors (rounded block sizes), as ``torch.cuda.memory_allocated``."""
    return _stat("allocated_bytes.all.current", device)


def max_memory_allocated(device=None) -> int:
    return _stat("allocated_bytes.all.peak", device)


def memory_reserved(device=None) -> int:
    """Bytes of segments the shim holds from the runtime."""
    return _stat("reserved_bytes.all.current", device)


def max_memory_reserved(device=None) -> int:
    return _stat("reserved_bytes.all.peak", device)


def memory_pending(device=None) -> int:
    """Bytes freed but held until other streams' events fire (the shim's own)."""
    return _stat("pending_bytes.all.current", device)


def reset_peak_memory_stats(device=None) -> None:
    api.reset_peak(_device_index(device))


def reset_max_memory_allocated(device=None) -> None:
    reset_peak_memory_stats(device)


def reset_accumulated_memory_stats(device=None) -> None:
    api.reset_accumulated(_device_index(device))


def empty_cache() -> None:
    """Returns the shim's free segments to the runtime."""
    api.empty_cache()


def set_per_process_memory_fraction(fraction: float, device=None) -> None:
    api.set_memory_fraction(fraction, _device_index(device))


def get_per_process_memory_fraction(device=None) -> float:
    return api.memory_fraction(_device_index(device))


def memory_snapshot() -> list:
    """The shim's segments in the format of ``torch.cuda.memory_snapshot()``
    (each block's recorded streams and pending use events as frames)."""
    return snapshot()["segments"]


def snapshot() -> dict:
    """The shim's state as ``torch.cuda.memory._snapshot()``: segments, and
    device_traces from the allocator trace when it is on (``shim.set_trace``;
    reading it drains it)."""
    from ..viz import lives, memory_viz

    events = api.trace()
    return memory_viz.build(api.snapshot(), lives.build(events) if events else None)


__all__ = [
    "empty_cache", "get_per_process_memory_fraction", "max_memory_allocated", "max_memory_reserved",
    "memory_allocated", "memory_pending", "memory_reserved", "memory_snapshot", "memory_stats",
    "memory_stats_as_nested_dict", "reset_accumulated_memory_stats", "reset_max_memory_allocated",
    "reset_peak_memory_stats", "set_per_process_memory_fraction",
]
