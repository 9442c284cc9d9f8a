"""Loads the native shim library with ctypes and declares its C ABI
(allocator_shim/include/npu_lifetime_shim.h)."""
from __future__ import annotations

import ctypes
import os
from functools import lru_cache
from pathlib import Path

_NATIVE_DIR = Path(__file__).resolve().parent.parent / "_native"

ALLOC_HOOK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
FREE_HOOK = ALLOC_HOOK

_P, _I, _S, _U64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_ssize_t, ctypes.c_uint64
_STR, _Z = ctypes.c_char_p, ctypes.c_size_t
_U64P = ctypes.POINTER(ctypes.c_uint64)
_PROTOTYPES = {
    "npl_alloc": (_P, [_S, _I, _P]),
    "npl_free": (None, [_P, _S, _I, _P]),
    "npl_record_stream": (_I, [_P, _P]),
    "npl_record_stream_device": (_I, [_P, _P, _I]),
    "npl_erase_stream": (_I, [_P, _P]),
    "npl_record_use": (_I, [_P, _P]),
    "npl_record_use_device": (_I, [_P, _P, _I]),
    "npl_note_use": (_I, [_P, _P]),
    "npl_set_policy": (_I, [_I]),
    "npl_get_policy": (_I, []),
    "npl_set_expandable_segments": (None, [_I]),
    "npl_get_expandable_segments": (_I, []),
    "npl_set_debug": (None, [_I, _U64]),
    "npl_get_debug": (_I, []),
    "npl_set_graph_capture_record_stream_reuse": (_I, [_I]),
    "npl_get_graph_capture_record_stream_reuse": (_I, []),
    "npl_set_stream_ordered": (_I, [_I]),
    "npl_get_stream_ordered": (_I, []),
    "npl_set_cross_stream_reuse": (_I, [_I]),
    "npl_get_cross_stream_reuse": (_I, []),
    "npl_set_captures_announced": (None, [_I]),
    "npl_get_captures_announced": (_I, []),
    "npl_process_events": (None, []),
    "npl_empty_cache": (None, []),
    "npl_init": (None, [_I]),
    "npl_set_memory_fraction": (None, [ctypes.c_double, _I]),
    "npl_get_memory_fraction": (ctypes.c_double, [_I]),
    "npl_base_allocation": (_P, [_P, ctypes.POINTER(_Z)]),
    "npl_begin_allocate_to_pool": (None, [_I, _U64, _U64, _P]),
    "npl_end_allocate_to_pool": (None, [_I, _U64, _U64]),
    "npl_release_pool": (None, [_I, _U64, _U64]),
    "npl_empty_pool_cache": (None, [_I, _U64, _U64]),
    "npl_set_pool_allocator": (None, [_I, _U64, _U64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]),
    "npl_pool_live_allocations": (_Z, [_I, _U64, _U64, _U64P, _Z]),
    "npl_claim_next": (None, [_P]),
    "npl_create_or_incref_pool": (None, [_I, _U64, _U64]),
    "npl_pool_use_count": (_I, [_I, _U64, _U64]),
    "npl_prepare_pool_checkpoint": (_I, [_I, _U64, _U64]),
    "npl_set_history_hook": (None, [_P, _P]),
    "npl_set_pool_use_on_oom": (None, [_I, _U64, _U64, _I]),
    "npl_set_pool_no_split": (None, [_I, _U64, _U64]),
    "npl_block_records": (_Z, [_P, _Z]),
    "npl_stats_count": (_Z, []),
    "npl_stats_names_json": (_P, []),
    "npl_stats_meanings_json": (_P, []),
    "npl_stats_values": (_Z, [_I, _U64P, _Z]),
    "npl_reset_peak": (None, [_I]),
    "npl_reset_accumulated": (None, [_I]),
    "npl_snapshot_json": (_P, []),
    "npl_drain_findings_json": (_P, []),
    "npl_drain_trace_json": (_P, []),
    "npl_set_trace": (None, [_I, _Z]),
    "npl_free_string": (None, [_P]),
    "npl_select_runtime": (_I, [_STR, _STR]),
    "npl_probe_runtime": (_I, [_STR, _STR]),
    "npl_runtime_name": (_STR, []),
    "npl_device_count": (_I, []),
    "npl_last_error": (_STR, []),
    "npl_last_oom_message": (_STR, []),
    "npl_reset": (None, []),
    "npl_set_hooks": (None, [ALLOC_HOOK, FREE_HOOK, _P]),
    "npl_set_npu_stream_resolver": (None, [_P]),
    "npl_set_acl_queue_ops": (_I, [_P]),
    "npl_sim_complete": (None, [_P]),
    "npl_sim_complete_all": (None, []),
    "npl_sim_complete_to": (None, [_P, _U64]),
    "npl_sim_launch": (_U64, [_P]),
    "npl_sim_record_event": (_P, [_P]),
    "npl_sim_wait_event": (None, [_P, _P]),
    "npl_sim_set_capturing": (None, [_P, _I]),
    "npl_sim_set_memory_limit": (None, [_U64]),
    "npl_sim_set_device": (None, [_I]),
    "npl_sim_stream_waits": (_U64, [_P]),
    "npl_sim_incomplete_events": (_U64, []),
    "npl_sim_event_syncs": (_U64, []),
    "npl_sim_mapped_bytes": (_U64, []),
    "npl_sim_reserved_bytes": (_U64, []),
    "npl_sim_accessible": (_I, [_P, _Z]),
    "npl_sim_illegal_accesses": (_U64, []),
    "npl_sim_fill": (_I, [_P, _P, _I, _Z]),
    "npl_sim_capture_frontier": (_Z, [_P, _U64P, ctypes.POINTER(_P), _Z]),
    "npl_sim_node_parents": (_Z, [_P, ctypes.POINTER(_P), _Z]),
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
    path = library_path()
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as err:
        if os.environ.get("NPU_LIFETIME_SHIM"):
            raise ShimNotBuilt(f"cannot load the allocator shim NPU_LIFETIME_SHIM={path}: {err}; point it at a built "
                               "libnpl*.so, or unset it to use the one the install built") from err
        raise ShimNotBuilt(f"cannot load the allocator shim {path}: {err}; rebuild it with `pip install -e .`") from err
    missing = [name for name in _PROTOTYPES if not hasattr(lib, name)]
    if missing:
        raise ShimNotBuilt(f"{path} is an older build (missing {', '.join(missing[:3])}...); "
                           "rebuild it with `pip install -e .`")
    for name, (restype, argtypes) in _PROTOTYPES.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib


def symbol_address(name: str) -> int:
    """The address of an exported function, for torch's allocator setters."""
    return ctypes.cast(getattr(library(), name), ctypes.c_void_p).value


def take_string(address: int | None) -> str:
    """Copies a string the shim allocated, then releases it."""
    if not address:
        raise RuntimeError("the shim returned no string (see its internal_error findings)")
    try:
        return ctypes.string_at(address).decode()
    finally:
        library().npl_free_string(address)
