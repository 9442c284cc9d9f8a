"""Typed Python wrappers over the shim's C ABI.  The shim is process-wide,
so these are module functions.  Pointers and streams are ints (a stream is
the runtime's handle: ``torch.cuda.Stream.cuda_stream``, or any non-zero
int under the simulated runtime)."""
from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Optional

from .native import STATS_FIELDS, NativeStats, library, take_string

POLICIES = {"poll": 0, "stream_wait": 1}


class ShimError(RuntimeError):
    pass


@dataclass(frozen=True)
class ShimStats:
    live_bytes: int
    live_blocks: int
    cached_bytes: int
    cached_blocks: int
    pending_bytes: int
    pending_blocks: int
    reserved_bytes: int
    segments: int
    peak_live_bytes: int
    peak_reserved_bytes: int
    peak_active_bytes: int
    requested_live_bytes: int
    allocations: int
    frees: int
    cache_hits: int
    segment_allocs: int
    segment_frees: int
    oom_retries: int
    oom_failures: int
    events_created: int
    events_recorded: int
    stream_waits: int
    deferred_frees: int
    findings: int
    findings_dropped: int


assert tuple(f.name for f in fields(ShimStats)) == STATS_FIELDS


def select_runtime(name: str = "auto", library_path: Optional[str] = None) -> None:
    """``cuda``, ``acl`` (optionally from ``library_path``), ``sim`` or ``auto``."""
    lib = library()
    if lib.npl_select_runtime(name.encode(), library_path.encode() if library_path else None) != 0:
        raise ShimError(f"cannot select runtime {name!r}: {lib.npl_last_error().decode()}")


def runtime_name() -> str:
    return library().npl_runtime_name().decode()


def alloc(size: int, device: int = 0, stream: int = 0) -> int:
    """A block of ``size`` bytes for ``stream``; 0 for a zero-byte request or
    when the runtime is out of memory (see ``findings()``)."""
    return library().npl_alloc(size, device, stream) or 0


def free(ptr: int, size: int, device: int = 0, stream: int = 0) -> None:
    library().npl_free(ptr, size, device, stream)


def _lifetime_call(name: str, ptr: int, stream: int) -> bool:
    return getattr(library(), name)(ptr, stream) == 0


def record_stream(ptr: int, stream: int) -> bool:
    """The free of ``ptr`` waits for everything queued on ``stream`` up to
    the free.  False (and a finding) if ``ptr`` is not a live block."""
    return _lifetime_call("npl_record_stream", ptr, stream)


def erase_stream(ptr: int, stream: int) -> bool:
    return _lifetime_call("npl_erase_stream", ptr, stream)


def record_use(ptr: int, stream: int) -> bool:
    """The free of ``ptr`` waits for what is queued on ``stream`` now."""
    return _lifetime_call("npl_record_use", ptr, stream)


def note_use(ptr: int, stream: int) -> bool:
    """Tells the shim of a use on ``stream`` that nothing recorded: a free
    before it finishes is a finding, and the reuse waits for it."""
    return _lifetime_call("npl_note_use", ptr, stream)


def set_policy(policy: str) -> None:
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; expected one of {sorted(POLICIES)}")
    library().npl_set_policy(POLICIES[policy])


def policy() -> str:
    code = library().npl_get_policy()
    return next(name for name, value in POLICIES.items() if value == code)


def process_events() -> None:
    library().npl_process_events()


def empty_cache() -> None:
    library().npl_empty_cache()


def stats() -> ShimStats:
    raw = NativeStats()
    library().npl_get_stats(raw)
    return ShimStats(*(getattr(raw, name) for name in STATS_FIELDS))


def reset_peak() -> None:
    library().npl_reset_peak()


def snapshot() -> dict:
    """Segments and blocks, with each block's state, allocation stream,
    recorded streams and use events."""
    return json.loads(take_string(library().npl_snapshot_json()))


def findings() -> list:
    """Drains the shim's findings (each a dict with at least kind, op, address)."""
    return json.loads(take_string(library().npl_drain_findings_json()))


def reset() -> None:
    """Drops every block, segment, event, statistic and finding (tests only:
    memory handed out before is gone)."""
    library().npl_reset()


class sim:
    """Controls of the simulated runtime."""

    @staticmethod
    def complete(stream: int) -> None:
        library().npl_sim_complete(stream)

    @staticmethod
    def complete_all() -> None:
        library().npl_sim_complete_all()

    @staticmethod
    def set_capturing(stream: int, capturing: bool) -> None:
        library().npl_sim_set_capturing(stream, int(capturing))

    @staticmethod
    def set_memory_limit(nbytes: int) -> None:
        library().npl_sim_set_memory_limit(nbytes)

    @staticmethod
    def stream_waits(stream: int) -> int:
        return library().npl_sim_stream_waits(stream)

    @staticmethod
    def incomplete_events() -> int:
        return library().npl_sim_incomplete_events()
