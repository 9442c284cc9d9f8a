"""Typed Python wrappers over the shim's C ABI.  The shim is process-wide,
so these are module functions.  Pointers and streams are ints (a stream is
the runtime's handle: ``torch.cuda.Stream.cuda_stream``, or any non-zero
int under the simulated runtime)."""
from __future__ import annotations

import ctypes
import json
import warnings
from functools import lru_cache
from typing import Optional, Tuple

from . import arguments as check
from .libnpl import library, take_string

POLICIES = {"poll": 0, "stream_wait": 1, "lazy_wait": 2}
DEFAULT_POLICY = "lazy_wait"
DEFAULT_QUARANTINE_BYTES = 256 << 20

PoolId = Tuple[int, int]


class ShimError(RuntimeError):
    pass


RUNTIMES = ("cuda", "acl", "sim", "auto")


def _runtime_arguments(name, library_path) -> tuple:
    check.text(name, "the runtime", ", ".join(RUNTIMES))
    if library_path is None:
        return name.encode(), None
    if name != "acl":
        raise ValueError(f"library_path is for the acl runtime (a libascendcl to load), not for {name!r}")
    path = library_path if isinstance(library_path, str) else getattr(library_path, "__fspath__", lambda: None)()
    if not isinstance(path, str):
        raise TypeError(f"library_path must be a path (a str or os.PathLike), not {type(library_path).__name__} "
                        f"{library_path!r}")
    return name.encode(), path.encode()


def select_runtime(name: str = "auto", library_path: Optional[str] = None) -> None:
    """``cuda``, ``acl`` (optionally from ``library_path``), ``sim`` or ``auto``.
    Only while the shim holds no memory."""
    lib = library()
    if lib.npl_select_runtime(*_runtime_arguments(name, library_path)) != 0:
        why = lib.npl_last_error().decode()
        if "holds memory" in why:
            why += " (free its blocks and call npu_lifetime.shim.empty_cache() first)"
        raise ShimError(f"cannot select runtime {name!r}: {why}")


def probe_runtime(name: str, library_path: Optional[str] = None) -> None:
    """Raises ShimError if ``select_runtime(name)`` would fail; changes nothing."""
    lib = library()
    if lib.npl_probe_runtime(*_runtime_arguments(name, library_path)) != 0:
        raise ShimError(f"cannot use runtime {name!r}: {lib.npl_last_error().decode()}")


def runtime_name() -> str:
    return library().npl_runtime_name().decode()


def device_count() -> int:
    """Devices the selected runtime sees (-1 when none is selected)."""
    return library().npl_device_count()


def alloc(size: int, device: int = 0, stream: int = 0) -> int:
    """A block of ``size`` bytes for ``stream``; 0 for a zero-byte request or
    when out of memory (``last_oom_message()`` and ``findings()`` say why)."""
    return library().npl_alloc(check.size(size), check.device(device), check.stream(stream)) or 0


def free(ptr: int, size: int, device: int = 0, stream: int = 0) -> None:
    """Frees the block at ``ptr`` (0: nothing).  An unknown pointer, a double
    free, another size or stream: a finding (``findings()``), never a crash."""
    library().npl_free(check.address(ptr), check.size(size), check.device(device), check.stream(stream))


def last_oom_message() -> str:
    """Why this thread's last allocation failed ("" if none did)."""
    return library().npl_last_oom_message().decode()


def _using_stream(stream: int, call: str) -> int:
    """A stream that uses a block.  0 is the default stream on CUDA and ACL,
    but no stream under the simulated runtime: an event cannot be recorded
    on it, so the block would not be held (the free reported a runtime error)."""
    value = check.stream(stream)
    if value == 0 and runtime_name() == "sim":
        raise ValueError(f"{call}: stream 0 is no stream under the simulated runtime (its streams are non-zero "
                         "handles): pass the handle of the stream that uses the block")
    return value


def record_stream(ptr: int, stream: int, stream_device: int = -1) -> bool:
    """The free of the block holding ``ptr`` waits for everything queued on
    ``stream`` up to the free.  False (and a finding) if no live block holds ``ptr``."""
    return library().npl_record_stream_device(check.address(ptr), _using_stream(stream, "record_stream"),
                                              check.stream_device(stream_device)) == 0


def erase_stream(ptr: int, stream: int) -> bool:
    """Withdraws a ``record_stream(ptr, stream)``.  False (and a finding) if
    no live block holds ``ptr``."""
    return library().npl_erase_stream(check.address(ptr), _using_stream(stream, "erase_stream")) == 0


def record_use(ptr: int, stream: int, stream_device: int = -1) -> bool:
    """The reuse of the block holding ``ptr`` waits for what is queued on ``stream`` now."""
    return library().npl_record_use_device(check.address(ptr), _using_stream(stream, "record_use"),
                                           check.stream_device(stream_device)) == 0


def note_use(ptr: int, stream: int) -> bool:
    """Tells the shim of a use on ``stream`` that nothing recorded: a free
    before it finishes is a finding, and the reuse waits for it."""
    return library().npl_note_use(check.address(ptr), _using_stream(stream, "note_use")) == 0


def set_policy(policy: str) -> None:
    check.text(policy, "policy", ", ".join(sorted(POLICIES)))
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; expected one of {sorted(POLICIES)}")
    library().npl_set_policy(POLICIES[policy])


def policy() -> str:
    code = library().npl_get_policy()
    return next(name for name, value in POLICIES.items() if value == code)


def set_expandable_segments(enabled: bool) -> None:
    """Expandable segments, as torch's ``expandable_segments:True``: new
    memory of the eager pool grows one segment per (device, stream, size
    class) by mapping pages at its end instead of a new segment per runtime
    allocation; ``empty_cache`` unmaps the free pages at the end.  Applies
    to the allocations that follow.  Under torch the bridge follows torch's
    own setting (``torch.cuda.memory._set_allocator_settings``)."""
    library().npl_set_expandable_segments(int(check.flag(enabled, "enabled")))


def expandable_segments() -> bool:
    return bool(library().npl_get_expandable_segments())


def set_debug(enabled: bool, quarantine_bytes: int = DEFAULT_QUARANTINE_BYTES) -> None:
    """Debug mode: freed blocks are poisoned (0xFF: NaN for floats, -1 for
    integers) once really free and held in a FIFO quarantine of up to
    ``quarantine_bytes``; a write into a quarantined block is reported
    (``write_after_free``) when it leaves the quarantine."""
    enabled = check.flag(enabled, "enabled")
    library().npl_set_debug(int(enabled), check.count(quarantine_bytes, "quarantine_bytes"))


def debug() -> bool:
    return bool(library().npl_get_debug())


def set_graph_capture_record_stream_reuse(enabled: bool) -> None:
    """torch's allocator setting of that name (off by default): a block freed
    during a graph capture while streams it was ``record_stream``-ed on may
    still use it is reused inside the capture once the capture's graph joins
    those streams into the allocating stream, instead of waiting for the
    capture's end.  Warns when the selected runtime can't tell a capture's
    graph (then such frees wait for the capture's end, as when off)."""
    enabled = check.flag(enabled, "enabled")
    if library().npl_set_graph_capture_record_stream_reuse(int(enabled)) != 0:
        warnings.warn(f"npu_lifetime: graph_capture_record_stream_reuse is not supported on the {runtime_name()} "
                      "runtime (no capture graph to ask); frees during a capture wait for its end",
                      RuntimeWarning, stacklevel=2)


def set_stream_ordered(enabled: bool) -> None:
    """The oracle mode: each eager block is a stream-ordered allocation of its
    own, freed stream-ordered on its stream once the shim makes it reusable,
    after that stream waited on the block's events, so that compute-sanitizer
    (``--track-stream-ordered-races all``) checks every reuse decision.  The
    policy becomes stream_wait.  Only while the shim holds no memory; raises
    ``RuntimeError`` saying why it can't (no cudaMallocAsync, memory held)."""
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be True or False, not {enabled!r}")
    if library().npl_set_stream_ordered(int(enabled)) != 0:
        raise RuntimeError(last_oom_message() or "npu_lifetime: the oracle mode could not be switched")


CROSS_STREAM_MODES = ("off", "always", "idle")  # npl_set_cross_stream_reuse's values, in order


def set_cross_stream_reuse(mode) -> None:
    """Cross-stream reuse: an allocation its stream's pool can't serve takes a
    whole free segment of another stream's pool.  ``"idle"``: only once that
    stream's work and the block's events are done (no GPU-side wait added);
    ``"always"`` (or True): behind GPU-side waits on them; ``"off"`` (or
    False): never, torch's per-stream caching (design/allocator-shim.md,
    "Cross-stream reuse")."""
    if isinstance(mode, bool):
        mode = "always" if mode else "off"
    if mode not in CROSS_STREAM_MODES:
        raise ValueError(f"cross-stream reuse must be one of {CROSS_STREAM_MODES} (or True/False), not {mode!r}")
    if library().npl_set_cross_stream_reuse(CROSS_STREAM_MODES.index(mode)) != 0:
        raise RuntimeError(f"npu_lifetime: cross-stream reuse could not be set to {mode!r}")


def cross_stream_reuse() -> str:
    """The cross-stream reuse mode: ``"off"``, ``"idle"`` or ``"always"``."""
    return CROSS_STREAM_MODES[library().npl_get_cross_stream_reuse()]


def set_captures_announced(announced: bool) -> None:
    """Every capture begins with begin_allocate_to_pool and ends with
    end_allocate_to_pool (torch's CUDA graphs: install("cuda") sets it), so
    an allocation need not ask the runtime whether its stream is capturing
    before polling events (design D19)."""
    if not isinstance(announced, bool):
        raise TypeError(f"announced must be True or False, not {announced!r}")
    library().npl_set_captures_announced(int(announced))


def captures_announced() -> bool:
    return bool(library().npl_get_captures_announced())


def stream_ordered() -> bool:
    return bool(library().npl_get_stream_ordered())


def graph_capture_record_stream_reuse() -> bool:
    return bool(library().npl_get_graph_capture_record_stream_reuse())


def process_events() -> None:
    library().npl_process_events()


def empty_cache() -> None:
    library().npl_empty_cache()


def set_memory_fraction(fraction: float, device: int = 0) -> None:
    """Limits the bytes the shim reserves on ``device`` to ``fraction`` of
    the device's memory, as torch's ``set_per_process_memory_fraction``: 1
    (the default) the whole device, 0 nothing."""
    library().npl_set_memory_fraction(check.fraction(fraction), check.device(device))


def memory_fraction(device: int = 0) -> float:
    return library().npl_get_memory_fraction(check.device(device))


def base_allocation(ptr: int) -> Tuple[int, int]:
    """The segment holding ``ptr``: (base address, size); (ptr, 0) if none."""
    size = ctypes.c_size_t(0)
    base = library().npl_base_allocation(check.address(ptr), ctypes.byref(size)) or 0
    return base, size.value


# -- graph capture into private pools --------------------------------------------
def begin_allocate_to_pool(device: int, pool: PoolId, stream: int = 0) -> None:
    """Allocations on ``device`` from ``stream`` (0: any stream) go to the
    private ``pool`` until ``end_allocate_to_pool``."""
    pool = check.pool(pool)
    library().npl_begin_allocate_to_pool(check.device(device), pool[0], pool[1], check.stream(stream))


def end_allocate_to_pool(device: int, pool: PoolId) -> None:
    pool = check.pool(pool)
    library().npl_end_allocate_to_pool(check.device(device), pool[0], pool[1])


def empty_pool_cache(device: int, pool: PoolId) -> None:
    """``empty_cache`` for one graph pool: its fully free segments go back
    (device -1: on every device), every other segment stays."""
    pool = check.pool(pool)
    library().npl_empty_pool_cache(-1 if device == -1 else check.device(device), pool[0], pool[1])


def release_pool(device: int, pool: PoolId) -> None:
    pool = check.pool(pool)
    library().npl_release_pool(check.device(device), pool[0], pool[1])


def pool_live_allocations(device: int, pool: PoolId) -> list:
    """The addresses of the pool's live blocks."""
    lib = library()
    device, pool = check.device(device), check.pool(pool)
    n = lib.npl_pool_live_allocations(device, pool[0], pool[1], None, 0)
    out = (ctypes.c_uint64 * max(n, 1))()
    n = lib.npl_pool_live_allocations(device, pool[0], pool[1], out, n)
    return list(out[:n])


def create_or_incref_pool(device: int, pool: PoolId) -> None:
    """A reference to ``pool`` with no capture begun (torch.cuda.MemPool)."""
    pool = check.pool(pool)
    library().npl_create_or_incref_pool(check.device(device), pool[0], pool[1])


def pool_use_count(device: int, pool: PoolId) -> int:
    """The pool's references (0: never opened, or all released)."""
    pool = check.pool(pool)
    return library().npl_pool_use_count(check.device(device), pool[0], pool[1])


# npl_prepare_pool_checkpoint's refusals, in torch's words
_CHECKPOINT_REFUSALS = {1: "Not expected to checkpoint freeable graph", 2: "Could not find pool of id"}


def pool_checkpoint(device: int, pool: PoolId) -> dict:
    """The pool's live blocks, address -> (block size, stream), as torch's
    PrivatePoolState keeps them: each at its block's rounded size, after the
    frees a capture deferred are done.  RuntimeError (torch's words) for a
    released pool or one never opened."""
    pool, device = check.pool(pool), check.device(device)
    verdict = library().npl_prepare_pool_checkpoint(device, pool[0], pool[1])
    if verdict != 0:
        raise RuntimeError(f"npu_lifetime shim: {_CHECKPOINT_REFUSALS[verdict]} {pool}")
    return {r["address"]: (r["size"], r["stream"]) for r in block_records()
            if r["device"] == device and (r["pool_id0"], r["pool_id1"]) == pool and r["state"] == 0}


def set_pool_use_on_oom(device: int, pool: PoolId, use_on_oom: bool) -> None:
    """torch.cuda.MemPool(use_on_oom=True): an eager allocation about to run
    out of memory may take this pool's cached blocks (while it has references)."""
    pool = check.pool(pool)
    library().npl_set_pool_use_on_oom(check.device(device), pool[0], pool[1], int(bool(use_on_oom)))


def set_pool_no_split(device: int, pool: PoolId) -> None:
    """torch.cuda.MemPool(no_split=True): the pool never splits a block."""
    pool = check.pool(pool)
    library().npl_set_pool_no_split(check.device(device), pool[0], pool[1])


class BlockRecord(ctypes.Structure):
    """``struct npl_block_record``: one block, as the CUDA bridge reads them."""
    _fields_ = [("segment", ctypes.c_void_p), ("segment_size", ctypes.c_uint64),
                ("segment_stream", ctypes.c_void_p), ("pool_id0", ctypes.c_uint64), ("pool_id1", ctypes.c_uint64),
                ("address", ctypes.c_void_p), ("size", ctypes.c_uint64), ("requested", ctypes.c_uint64),
                ("stream", ctypes.c_void_p), ("device", ctypes.c_int32), ("small", ctypes.c_int32),
                ("state", ctypes.c_int32), ("events", ctypes.c_int32), ("expandable", ctypes.c_int32),
                ("reserved_", ctypes.c_int32)]


BLOCK_STATES = ("live", "pending", "cached")  # enum npl_block_state


def block_records() -> list:
    """Every block as the C ABI's flat records (dicts), segments in address order."""
    lib = library()
    while True:
        n = lib.npl_block_records(None, 0)
        out = (BlockRecord * max(n, 1))()
        got = lib.npl_block_records(out, n)
        if got <= n:
            return [{name: getattr(r, name) or 0 for name, _ in BlockRecord._fields_} for r in out[:got]]


def claim_next(ptr: int) -> None:
    """This thread's next allocation takes the cached memory at ``ptr``
    (restoring a graph pool checkpoint through torch's allocator).  ``ptr``
    must lie in a cached block that carries no events: else ValueError, and
    the next allocation is left alone."""
    ptr = check.address(ptr)
    if not _claimable(ptr):
        raise ValueError(
            f"claim_next({ptr:#x}): no cached block without pending events holds this address (see "
            "npu_lifetime.shim.snapshot()); claim only memory a graph pool checkpoint held and that is free now"
        )
    library().npl_claim_next(ptr)


def _claimable(ptr: int) -> bool:
    return any(b["state"] == "cached" and not b["held_events"] and b["address"] <= ptr < b["address"] + b["size"]
               for seg in snapshot()["segments"] for b in seg["blocks"])


# -- statistics, snapshot, findings, trace ------------------------------------------
@lru_cache(maxsize=None)
def stat_names() -> tuple:
    """Every statistic's name, torch-style ("allocated_bytes.all.current")."""
    return tuple(json.loads(take_string(library().npl_stats_names_json())))


@lru_cache(maxsize=None)
def stat_meanings() -> dict:
    """{statistic: what it counts}, without the ``.pool.field`` suffixes."""
    return json.loads(take_string(library().npl_stats_meanings_json()))


def stats(device: int = 0) -> dict:
    """The statistics of ``device``: {name: value} for every name in
    ``stat_names()`` (torch's ``memory_stats`` keys where the meaning is the same)."""
    names = stat_names()
    values = (ctypes.c_uint64 * len(names))()
    library().npl_stats_values(check.device(device), values, len(names))
    return dict(zip(names, values))


def reset_peak(device: int = 0) -> None:
    library().npl_reset_peak(check.device(device))


def reset_accumulated(device: int = 0) -> None:
    library().npl_reset_accumulated(check.device(device))


def snapshot() -> dict:
    """Segments and blocks, with each block's state, allocation stream,
    generation, recorded streams, use events and held events."""
    return json.loads(take_string(library().npl_snapshot_json()))


def findings() -> list:
    """Drains the shim's findings (each a dict with at least kind, op, address)."""
    return json.loads(take_string(library().npl_drain_findings_json()))


def set_trace(enabled: bool, capacity: int = 65536) -> None:
    """Records what happens to blocks (see ``trace``) in a ring of ``capacity`` events."""
    enabled = check.flag(enabled, "enabled")
    library().npl_set_trace(int(enabled), check.count(capacity, "capacity"))


def trace() -> list:
    """Drains the trace, oldest first: dicts with t_ns, kind, ptr, size,
    device, stream, alloc_stream, generation."""
    return json.loads(take_string(library().npl_drain_trace_json()))


def reset() -> None:
    """Drops every block, segment, event, statistic and finding (tests only:
    memory handed out before is gone)."""
    library().npl_reset()


class sim:
    """Controls of the simulated runtime."""

    @staticmethod
    def complete(stream: int) -> None:
        """``stream`` runs: to its end, or to a wait on an event not yet complete."""
        library().npl_sim_complete(check.stream(stream))

    @staticmethod
    def complete_to(stream: int, position: int) -> None:
        library().npl_sim_complete_to(check.stream(stream), check.count(position, "position"))

    @staticmethod
    def launch(stream: int) -> int:
        """A kernel queued on ``stream``; returns its position."""
        return library().npl_sim_launch(check.stream(stream))

    @staticmethod
    def record_event(stream: int) -> int:
        """A new event recorded on ``stream`` (its handle)."""
        return library().npl_sim_record_event(check.stream(stream)) or 0

    @staticmethod
    def wait_event(stream: int, event: int) -> None:
        """``stream`` waits GPU-side for ``event``."""
        event = check.address(event, "event", "an event handle (an int, from sim.record_event)")
        library().npl_sim_wait_event(check.stream(stream), event)

    @staticmethod
    def complete_all() -> None:
        library().npl_sim_complete_all()

    @staticmethod
    def set_capturing(stream: int, capturing: bool) -> None:
        library().npl_sim_set_capturing(check.stream(stream), int(check.flag(capturing, "capturing")))

    @staticmethod
    def set_memory_limit(nbytes: int) -> None:
        library().npl_sim_set_memory_limit(check.count(nbytes, "nbytes"))

    @staticmethod
    def set_device(device: int) -> None:
        library().npl_sim_set_device(check.device(device))

    @staticmethod
    def stream_waits(stream: int) -> int:
        return library().npl_sim_stream_waits(check.stream(stream))

    @staticmethod
    def incomplete_events() -> int:
        return library().npl_sim_incomplete_events()

    @staticmethod
    def event_syncs() -> int:
        return library().npl_sim_event_syncs()

    @staticmethod
    def mapped_bytes() -> int:
        """Bytes of physical chunks mapped now (expandable segments)."""
        return library().npl_sim_mapped_bytes()

    @staticmethod
    def reserved_bytes() -> int:
        """Bytes of address space reserved now (expandable segments)."""
        return library().npl_sim_reserved_bytes()

    @staticmethod
    def accessible(ptr: int, size: int) -> bool:
        """Whether a kernel may touch ``[ptr, ptr + size)``: malloc'd, or mapped with access."""
        return bool(library().npl_sim_accessible(ptr, size))

    @staticmethod
    def illegal_accesses() -> int:
        """Fills and reads the simulated device refused for touching unmapped memory."""
        return library().npl_sim_illegal_accesses()

    @staticmethod
    def fill(stream: int, ptr: int, byte: int, size: int) -> bool:
        """A kernel on ``stream`` writing ``byte`` over ``size`` bytes at ``ptr``; False if refused."""
        return library().npl_sim_fill(check.stream(stream), ptr, byte, size) == 0

    @staticmethod
    def capture_frontier(stream: int) -> Tuple[int, list]:
        """The capture ``stream`` takes part in (0: none) and its frontier: the
        graph nodes its next captured work will depend on (handles, ints)."""
        capture = ctypes.c_uint64(0)
        nodes = _nodes(lambda out, n: library().npl_sim_capture_frontier(
            check.stream(stream), ctypes.byref(capture), out, n))
        return capture.value, nodes

    @staticmethod
    def node_parents(node: int) -> list:
        """The nodes graph node ``node`` depends on."""
        node = check.address(node, "node", "a graph node handle (an int, from sim.capture_frontier)")
        return _nodes(lambda out, n: library().npl_sim_node_parents(node, out, n))


def _nodes(fill) -> list:
    """The nodes ``fill(array, capacity)`` writes, however many there are."""
    capacity = 16
    while True:
        out = (ctypes.c_void_p * capacity)()
        n = fill(out, capacity)
        if n <= capacity:
            return [out[i] for i in range(n)]
        capacity = n
