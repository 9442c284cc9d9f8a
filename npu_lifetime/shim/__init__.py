"""The Python binding of the native allocator shim (allocator_shim/)."""
from .api import (
    POLICIES,
    ShimError,
    ShimStats,
    alloc,
    empty_cache,
    erase_stream,
    findings,
    free,
    note_use,
    policy,
    process_events,
    record_stream,
    record_use,
    reset,
    reset_peak,
    runtime_name,
    select_runtime,
    set_policy,
    sim,
    snapshot,
    stats,
)
from .native import ShimNotBuilt, library_path

__all__ = [
    "POLICIES", "ShimError", "ShimNotBuilt", "ShimStats", "alloc", "empty_cache", "erase_stream",
    "findings", "free", "library_path", "note_use", "policy", "process_events", "record_stream",
    "record_use", "reset", "reset_peak", "runtime_name", "select_runtime", "set_policy", "sim",
    "snapshot", "stats",
]
