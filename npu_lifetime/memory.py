"""torch's memory functions, with torch's names and meanings, over the shim
on every device (the simulated runtime included): the public name of
``npu_lifetime.shim.memory``, where they are defined."""
from .shim.memory import (
    empty_cache,
    get_per_process_memory_fraction,
    max_memory_allocated,
    max_memory_reserved,
    memory_allocated,
    memory_pending,
    memory_reserved,
    memory_snapshot,
    memory_stats,
    memory_stats_as_nested_dict,
    reset_accumulated_memory_stats,
    reset_max_memory_allocated,
    reset_peak_memory_stats,
    set_per_process_memory_fraction,
    snapshot,
)

__all__ = [
    "empty_cache", "get_per_process_memory_fraction", "max_memory_allocated", "max_memory_reserved",
    "memory_allocated", "memory_pending", "memory_reserved", "memory_snapshot", "memory_stats",
    "memory_stats_as_nested_dict", "reset_accumulated_memory_stats", "reset_max_memory_allocated",
    "reset_peak_memory_stats", "set_per_process_memory_fraction", "snapshot",
]
