"""Loads the native shim library with ctypes and declares its C ABI
(allocator_shim/include/npu_lifetime_shim.h)."""
from __future__ import annotations

import ctypes
import os
from functools import lru_cache
from pathlib import Path

_NATIVE_DIR = Path(__file__).resolve().parent.parent / "_native"

STATS_FIELDS = (
    "live_bytes", "live_blocks", "cached_bytes", "cached_blocks",
    "pending_bytes", "pending_blocks", "reserved_bytes", "segments",
    "peak_live_bytes", "peak_reserved_bytes", "peak_active_bytes", "requested_live_bytes",
    "allocations", "frees", "cache_hits",
    "segment_allocs", "segment_frees", "oom_retries", "oom_failures",
    "events_created", "events_recorded", "stream_waits",
    "deferred_frees", "findings", "findings_dropped",
)


class NativeStats(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in STATS_FIELDS]


ALLOC_HOOK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
FREE_HOOK = ALLOC_HOOK

_P, _I, _S, _U64, _STR = ctypes.c_void_p, ctypes.c_int, ctypes.c_ssize_t, ctypes.c_uint64, ctypes.c_char_p
_PROTOTYPES = {
    "npl_alloc": (_P, [_S, _I, _P]),
    "npl_free": (None, [_P, _S, _I, _P]),
    "npl_record_stream": (_I, [_P, _P]),
    "npl_erase_stream": (_I, [_P, _P]),
    "npl_record_use": (_I, [_P, _P]),
    "npl_note_use": (_I, [_P, _P]),
    "npl_set_policy": (_I, [_I]),
    "npl_get_policy": (_I, []),
    "npl_process_events": (None, []),
    "npl_empty_cache": (None, []),
    "npl_stats_size": (ctypes.c_size_t, []),
    "npl_get_stats": (None, [ctypes.POINTER(NativeStats)]),
    "npl_reset_peak": (None, []),
    "npl_snapshot_json": (_P, []),
    "npl_drain_findings_json": (_P, []),
    "npl_free_string": (None, [_P]),
    "npl_select_runtime": (_I, [_STR, _STR]),
    "npl_runtime_name": (_STR, []),
    "npl_last_error": (_STR, []),
    "npl_reset": (None, []),
    "npl_set_hooks": (None, [ALLOC_HOOK, FREE_HOOK, _P]),
    "npl_sim_complete": (None, [_P]),
    "npl_sim_complete_all": (None, []),
    "npl_sim_set_capturing": (None, [_P, _I]),
    "npl_sim_set_memory_limit": (None, [_U64]),
    "npl_sim_stream_waits": (_U64, [_P]),
    "npl_sim_incomplete_events": (_U64, []),
}


class ShimNotBuilt(RuntimeError):
    pass


def library_path() -> Path:
    """The shim library: $NPU_LIFETIME_SHIM, else the one the install built."""
    override = os.environ.get("NPU_LIFETIME_SHIM")
    if override:
        return Path(override)
    built = sorted(_NATIVE_DIR.glob("libnpl*.so"))
    if not built:
        raise ShimNotBuilt(
            f"the allocator shim is not built (nothing in {_NATIVE_DIR}); "
            "run `pip install -e .` (or `python setup.py build_ext --inplace`) from the repository root"
        )
    return built[0]


@lru_cache(maxsize=None)
def library() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(library_path()))
    for name, (restype, argtypes) in _PROTOTYPES.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    if lib.npl_stats_size() != ctypes.sizeof(NativeStats):
        raise ShimNotBuilt(
            f"{library_path()} has another npl_stats layout "
            f"({lib.npl_stats_size()} bytes, expected {ctypes.sizeof(NativeStats)}); rebuild it"
        )
    return lib


def take_string(address: int | None) -> str:
    """Copies a string the shim allocated, then releases it."""
    if not address:
        raise RuntimeError("the shim returned no string (see its internal_error findings)")
    try:
        return ctypes.string_at(address).decode()
    finally:
        library().npl_free_string(address)
