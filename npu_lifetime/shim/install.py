"""Installs the shim as the process allocator of ``cuda`` or ``npu`` through
the framework's pluggable-allocator API, with every hook the allocator
object offers wired to the shim (record_stream from Python or C++,
erase_stream, empty_cache, the memory fraction, graph-capture pools), the
torch bridge for out-of-memory errors, and torch's memory functions routed
to the shim's statistics (``torch_api.py``).  What it set up is kept in
``state.py``, where the rest of the package reads it."""
from __future__ import annotations

import ctypes
import os
import warnings

from ..flags import env_flag, env_mode
from . import api
from . import arguments as check
from . import npu_queue, state
from .libnpl import library_path, symbol_address
from .state import InstallError, Installed, installed  # noqa: F401  (install's names, as before)

# device: (shim runtime, {allocator-object setter: shim entry point})
_DEVICES = {
    "cuda": ("cuda", {
        "set_init_fn": "npl_torch_init",
        "set_reset_fn": "npl_torch_empty_cache",
        "set_memory_fraction_fn": "npl_torch_set_memory_fraction",
        "set_base_alloc_fn": "npl_torch_base_alloc",
        "set_record_stream_fn": "npl_torch_record_stream",
        "set_begin_allocate_to_pool": "npl_torch_begin_allocate_to_pool",
        "set_end_allocate_to_pool_fn": "npl_torch_end_allocate_to_pool",
        "set_release_pool": "npl_torch_release_pool",
    }),
    "npu": ("acl", {
        "set_init_fn": "npl_torch_init",
        "set_reset_fn": "npl_torch_npu_empty_cache",  # void(bool) on torch_npu
        "set_memory_fraction_fn": "npl_torch_set_memory_fraction",
        "set_base_alloc_fn": "npl_torch_base_alloc",
        "set_record_stream_fn": "npl_torch_npu_record_stream",  # void(void*, NPUStream)
        "set_erase_stream_fn": "npl_torch_npu_erase_stream",
    }),
}


CROSS_STREAM_DEFAULT = "idle"  # takes only what no stream still uses: no GPU-side wait added (allocator-shim.md)


def cross_stream_mode() -> str:
    """The cross-stream reuse mode ``install()`` sets: NPU_LIFETIME_CROSS_STREAM_REUSE
    off (or 0: torch's per-stream caching), idle, always (or 1); unset: idle."""
    return env_mode("NPU_LIFETIME_CROSS_STREAM_REUSE", api.CROSS_STREAM_MODES, CROSS_STREAM_DEFAULT,
                    on="always", off="off")


# the setters through which torch announces each capture's begin and end
CAPTURE_ANNOUNCERS = {"set_begin_allocate_to_pool", "set_end_allocate_to_pool_fn"}


def captures_announced(device: str, wired) -> bool:
    """torch's CUDA graphs open a pool before each capture and close it after
    (both setters wired): the shim may trust that, as torch's allocator does.
    torch_npu's graph-pool hooks are not wired, so on NPU it keeps asking."""
    return device == "cuda" and CAPTURE_ANNOUNCERS <= set(wired)


def install(
    device: str = "cuda",
    policy: str = api.DEFAULT_POLICY,
    debug: bool = False,
    quarantine_bytes: int = api.DEFAULT_QUARANTINE_BYTES,
) -> Installed:
    """Makes the shim the allocator of ``device`` ("cuda" or "npu").

    Must run before the device allocates anything: the frameworks refuse to
    swap an allocator once it has been used.  ``policy``: "lazy_wait" (the
    default: a freed block is reused at once, the allocating stream waiting
    GPU-side on record_use events still pending), "poll" or "stream_wait".
    ``debug=True`` poisons freed blocks and quarantines them (see
    ``npu_lifetime.shim.api.set_debug``).  A call that fails changes nothing.
    """
    _installed = state.installed()
    _check_arguments(device, policy, debug, quarantine_bytes)
    if _installed is not None:
        if _installed.device != device:
            raise InstallError(f"the shim is already installed for {_installed.device}; one device type per process: "
                               f"run the {device} work in another process")
        _configure(policy, debug, quarantine_bytes)
        _installed = Installed(device, _installed.runtime, policy, debug, _installed.library, _installed.bridge,
                               _installed.hooks)
        return state.record(_installed)
    cross_stream = cross_stream_mode()  # a bad value refused before anything changes
    runtime, setters = _DEVICES[device]
    memory = _device_memory_module(device)
    try:
        api.probe_runtime(runtime)
    except api.ShimError as err:
        raise InstallError(f"cannot install the shim for {device}: {err}") from err
    npu_bridge = _npu_bridge() if device == "npu" else None
    cuda_bridge = _cuda_bridge() if device == "cuda" else None
    if cuda_bridge is not None:
        bridge, wired = cuda_bridge, tuple(setters) + CUDA_BRIDGE_ENTRIES
        _change_allocator(device, lambda: _install_cuda_bridge(cuda_bridge))
    else:
        bridge = _bridge()
        entries = {setter: symbol_address(entry) for setter, entry in setters.items()}
        if npu_bridge is not None:
            entries.update(npu_queue.statistics_hooks(npu_bridge))
        allocator, wired = _pluggable_allocator(device, memory, _entry_points(bridge, npu_bridge), entries)
        _change_allocator(device, lambda: memory.change_current_allocator(allocator))
    if device == "npu":
        npu_queue.connect(npu_bridge)  # before the ACL runtime is selected: its events go through the queue
    api.select_runtime(runtime)
    # torch opens a pool before each CUDA graph capture and closes it after:
    # the allocation path trusts that, as torch's allocator does (design D19)
    api.set_captures_announced(captures_announced(device, wired))
    _configure(policy, debug, quarantine_bytes)
    if env_flag("NPU_LIFETIME_SHIM_ORACLE"):  # the oracle mode, for compute-sanitizer (api.set_stream_ordered)
        api.set_stream_ordered(True)
    api.set_cross_stream_reuse(cross_stream)
    # the CUDA bridge follows torch's own setting at each allocation; otherwise the environment's, once
    if cuda_bridge is None and alloc_conf_expandable(ALLOC_CONF_VARIABLES[device]):
        api.set_expandable_segments(True)
    from . import torch_api

    torch_api.route_memory_functions(device, cuda_bridge=cuda_bridge is not None)
    _installed = Installed(device, runtime, policy, debug, str(library_path()), str(bridge) if bridge else None, wired)
    return state.record(_installed)


def _change_allocator(device: str, change) -> None:
    try:
        change()
    except RuntimeError as err:
        raise InstallError(
            f"cannot install the shim for {device}: the {device} allocator was already used "
            f"in this process ({err}). Call npu_lifetime.install() before any {device} tensor, "
            "stream or memory call."
        ) from err


def _check_arguments(device, policy, debug, quarantine_bytes) -> None:
    if not isinstance(device, str):
        raise TypeError(f"device must be 'cuda' or 'npu' (a device type, as a str), not {type(device).__name__} "
                        f"{device!r}")
    if device not in _DEVICES:
        kind = device.split(":")[0].strip().lower()
        hint = (f": the shim serves every {kind} device of the process, install({kind!r})" if kind in _DEVICES
                else "; on a machine with neither, use the simulated runtime (npu_lifetime.shim.select_runtime('sim'))")
        raise ValueError(f"device must be one of {sorted(_DEVICES)}, not {device!r}{hint}")
    check.text(policy, "policy", ", ".join(sorted(api.POLICIES)))
    if policy not in api.POLICIES:
        raise ValueError(f"policy must be one of {sorted(api.POLICIES)}, not {policy!r}")
    check.flag(debug, "debug")
    check.count(quarantine_bytes, "quarantine_bytes")


# The variable whose "expandable_segments:True" the framework's own allocator honours.
ALLOC_CONF_VARIABLES = {"cuda": "PYTORCH_CUDA_ALLOC_CONF", "npu": "PYTORCH_NPU_ALLOC_CONF"}


def alloc_conf_expandable(variable: str) -> bool:
    """Whether the allocator settings in ``variable`` ("key:value,...", as
    torch and torch_npu parse them) turn expandable segments on."""
    for item in os.environ.get(variable, "").split(","):
        key, _, value = item.partition(":")
        if key.strip() == "expandable_segments":
            return value.strip().lower() == "true"
    return False


def _configure(policy: str, debug: bool, quarantine_bytes: int) -> None:
    api.set_policy(policy)
    api.set_debug(debug, quarantine_bytes)


def _device_memory_module(device: str):
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise InstallError(
                "install('cuda') needs a CUDA device; none is available on this machine (torch "
                f"{torch.__version__}, cuda {torch.version.cuda or 'not built in'}). Run on a machine with a GPU, "
                "or use the simulated runtime: npu_lifetime.shim.select_runtime('sim')"
            )
        return torch.cuda.memory
    try:
        import torch_npu
    except ImportError as err:
        raise InstallError(
            f"install('npu') needs torch_npu, which cannot be imported here ({err}); install the torch_npu "
            "that matches your torch on a machine with an Ascend NPU"
        ) from err
    return torch_npu.npu.memory


def _npu_bridge():
    """The NPU bridge (torch_npu's task queue, its statistics hooks), built
    and loaded before anything changes; ``NPU_LIFETIME_BRIDGE=0`` leaves it
    out on purpose (diagnostics: events go straight through ACL)."""
    if os.environ.get("NPU_LIFETIME_BRIDGE", "1") == "0":
        warnings.warn(
            "npu_lifetime: NPU_LIFETIME_BRIDGE=0: the shim records its events straight through ACL; with "
            f"torch_npu's task queue on (level {npu_queue.queue_mode()} here) an event can complete before "
            "kernels still queued on the host, and a block be reused under them", RuntimeWarning, stacklevel=3,
        )
        return None
    return npu_queue.load(npu_queue.build())


# What torch's CUDAAllocator asks beyond the pluggable setters, answered by the CUDA bridge.
CUDA_BRIDGE_ENTRIES = ("cacheInfo", "recordHistory", "snapshot", "createOrIncrefPool", "getPoolUseCount",
                       "checkPoolLiveAllocations", "getCheckpointState", "setCheckpointPoolState")


def _cuda_bridge():
    """The CUDA bridge's path (the shim as torch's CUDA allocator, every entry
    point answered), or None: then the plain pluggable allocator, without
    those entry points."""
    from . import bridge

    return _optional_bridge(
        lambda: bridge.build(name=bridge.CUDA_BRIDGE), "NPU_LIFETIME_CUDA_BRIDGE",
        without="the shim is installed as a plain CUDAPluggableAllocator: cudnn benchmark, memory history, MemPool "
                "and cudagraph-tree checkpoints that need storages rewired raise",
    )


def _install_cuda_bridge(path) -> None:
    """Loads the CUDA bridge and makes it torch's CUDA allocator."""
    library = ctypes.CDLL(str(path))
    library.npl_cuda_install.argtypes = [ctypes.c_char_p]
    library.npl_cuda_install.restype = ctypes.c_char_p
    why = library.npl_cuda_install(str(library_path()).encode())
    if why is not None:
        raise RuntimeError(why.decode(errors="replace"))
    library.npl_cuda_registered.restype = ctypes.c_int
    if not library.npl_cuda_registered():
        warnings.warn("npu_lifetime: the shim is torch's CUDA allocator, but c10::GetAllocator(kCUDA) is held by "
                      "another registration of higher priority: torch.accelerator.memory_stats and other callers "
                      "of that registry read that allocator, not the shim", RuntimeWarning, stacklevel=3)


def _bridge():
    """The torch bridge's path, or None."""
    from . import bridge

    def built_and_connected():
        path = bridge.build()
        bridge.connect(path)
        return path

    return _optional_bridge(
        built_and_connected,
        without="without the torch bridge an allocation the shim cannot serve returns address 0 instead of raising "
                "torch.OutOfMemoryError (the shim's out_of_memory finding still says why)",
    )


def _optional_bridge(load, *switches: str, without: str):
    """``load()``'s bridge, or None: left out on purpose when
    ``NPU_LIFETIME_BRIDGE`` or one of ``switches`` is "0", and with a
    warning that says what is ``without`` it when it can't be built."""
    from . import bridge

    if any(os.environ.get(name, "1") == "0" for name in ("NPU_LIFETIME_BRIDGE", *switches)):
        return None
    try:
        return load()
    except bridge.BridgeUnavailable as err:
        warnings.warn(f"npu_lifetime: {err}; {without}", RuntimeWarning, stacklevel=4)
        return None


def _entry_points(bridge, npu_bridge) -> tuple:
    """(library, alloc, free) the framework calls: the shim, through the
    torch bridge when there is one (torch's out-of-memory error), through the
    NPU bridge first on npu (it learns each allocation's stream)."""
    path, alloc, free = (str(bridge), "npl_bridge_alloc", "npl_bridge_free") if bridge is not None else (
        str(library_path()), "npl_alloc", "npl_free")
    if npu_bridge is None:
        return path, alloc, free
    forward = ctypes.CDLL(path)
    npu_bridge.npl_npu_connect_allocation(ctypes.cast(getattr(forward, alloc), ctypes.c_void_p),
                                          ctypes.cast(getattr(forward, free), ctypes.c_void_p))
    return npu_bridge._name, "npl_npu_alloc", "npl_npu_free"


def _pluggable_allocator(device: str, memory, entry_points: tuple, entries: dict):
    """The framework's pluggable allocator over ``entry_points``, with every
    setter the allocator object offers wired."""
    allocator_class = memory.CUDAPluggableAllocator if device == "cuda" else memory.NPUPluggableAllocator
    allocator = allocator_class(*entry_points)
    raw = allocator.allocator()
    wired = []
    only = os.environ.get("NPU_LIFETIME_HOOKS")  # diagnostics: "none", or setters separated by commas
    for setter, address in entries.items():
        if only is not None and setter not in only.split(","):
            continue
        if hasattr(raw, setter):
            getattr(raw, setter)(address)
            wired.append(setter)
    return allocator, tuple(wired)


def stream_handle(stream) -> int:
    """The runtime handle of a torch.cuda / torch_npu stream."""
    handle = getattr(stream, "cuda_stream", None)
    if handle is None:
        from . import npu_queue

        return npu_queue.stream_handle(stream)
    return int(handle)
