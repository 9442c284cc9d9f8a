"""torch_npu's task queue and the shim.

With the task queue on (``TASK_QUEUE_ENABLE`` unset, 1 or 2: torch_npu's
default), ops are launched from a host thread: a kernel the user queued may
still sit on the host when the shim records an event, and an event recorded
straight through ACL would complete before it, letting a block be reused
under it.  torch_npu's own caching allocator records its events through the
queue (``c10_npu::NPUEvent::record``).  The NPU bridge
(``allocator_shim/torch_bridge/npu_queue_bridge.cpp``, built against the
torch_npu in use) does the same for the shim: its events, stream waits,
stream and device syncs go through torch_npu's NPUEvent/NPUStream, which
call ACL directly when the queue is off.  It also turns torch_npu streams
into aclrtStreams without draining the queue (``Stream.npu_stream`` drains
it).

Tested against the real torch_npu on a stand-in CANN runtime
(``tests/platforms/npu_standin``); it has not run on NPU hardware.
"""
from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Optional

from .libnpl import library
from .state import InstallError
from .streams import device_stream

_bridge: Optional[ctypes.CDLL] = None
_STREAM_RESOLVER = "_ZNK7c10_npu9NPUStream6streamEv"  # c10_npu::NPUStream::stream() const


def _torch_npu_library():
    import torch_npu

    return Path(torch_npu.__file__).resolve().parent / "lib" / "libtorch_npu.so"


def queue_mode() -> int:
    """torch_npu's task-queue level as it reads it: ASCEND_LAUNCH_BLOCKING=1
    forces 0; else TASK_QUEUE_ENABLE, 1 when unset."""
    if os.environ.get("ASCEND_LAUNCH_BLOCKING", "0").strip() == "1":
        return 0
    value = os.environ.get("TASK_QUEUE_ENABLE", "").strip()
    try:
        return int(value) if value else 1
    except ValueError:
        return 1


def build():
    """The NPU bridge's library path, built for this torch_npu if not cached;
    raises InstallError when it cannot be built."""
    from . import bridge

    try:
        return bridge.build(name=bridge.NPU_BRIDGE)
    except bridge.BridgeUnavailable as err:
        raise InstallError(
            f"install('npu') needs the NPU bridge, which orders the shim's events behind torch_npu's task queue "
            f"(a C++ compiler and torch_npu's headers, shipped in its wheel): {err}"
        ) from err


# DeviceStats' StatArrays in declaration order, then its counters (npu_queue_bridge.cpp)
_STAT_ARRAYS = ("allocation", "segment", "active", "inactive_split", "allocated_bytes", "reserved_bytes",
                "active_bytes", "inactive_split_bytes", "requested_bytes")
_COUNTERS = ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc", "num_device_free")
_POOL_STATS = tuple(f"{pool}.{kind}" for pool in ("all", "small_pool", "large_pool")
                    for kind in ("current", "peak", "allocated", "freed"))


def load(path) -> ctypes.CDLL:
    """Loads the NPU bridge and gives it the shim's statistics; changes
    nothing in the shim."""
    from .api import stat_names

    lib = ctypes.CDLL(str(path))
    lib.npl_npu_queue_ops.restype = ctypes.c_void_p
    lib.npl_npu_stream_handle.restype = ctypes.c_void_p
    lib.npl_npu_stream_handle.argtypes = [ctypes.c_int64, ctypes.c_int, ctypes.c_int]
    lib.npl_npu_last_error.restype = ctypes.c_char_p
    lib.npl_npu_device_stats_fn.restype = ctypes.c_void_p
    lib.npl_npu_reset_peak_status_fn.restype = ctypes.c_void_p
    lib.npl_npu_connect_allocation.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.npl_npu_connect_stats.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                                          ctypes.POINTER(ctypes.c_int), ctypes.c_size_t]
    names = stat_names()
    layout = [_array_start(names, array) for array in _STAT_ARRAYS] + [names.index(c) for c in _COUNTERS]
    shim = library()
    lib.npl_npu_connect_stats(ctypes.cast(shim.npl_stats_values, ctypes.c_void_p), len(names),
                              ctypes.cast(shim.npl_reset_peak, ctypes.c_void_p),
                              (ctypes.c_int * len(layout))(*layout), len(layout))
    return lib


def _array_start(names: tuple, array: str) -> int:
    start = names.index(f"{array}.all.current")
    assert names[start:start + len(_POOL_STATS)] == tuple(f"{array}.{s}" for s in _POOL_STATS), array
    return start


def statistics_hooks(lib: ctypes.CDLL) -> dict:
    """NPUPluggableAllocator's statistics setters -> the bridge's functions."""
    return {"set_get_device_stats_fn": lib.npl_npu_device_stats_fn(),
            "set_reset_peak_status_fn": lib.npl_npu_reset_peak_status_fn()}


def connect(lib: Optional[ctypes.CDLL]) -> None:
    """Hands the bridge's queue operations and stream resolver to the shim.
    Must run before the ACL runtime is selected.  Without a bridge, the
    record_stream hooks resolve NPUStreams with torch_npu's
    ``NPUStream::stream()``, which drains the queue."""
    global _bridge
    shim = library()
    if lib is None:
        npu = ctypes.CDLL(str(_torch_npu_library()), mode=os.RTLD_NOLOAD | os.RTLD_NOW)
        shim.npl_set_npu_stream_resolver(ctypes.cast(getattr(npu, _STREAM_RESOLVER), ctypes.c_void_p).value)
        return
    if shim.npl_set_acl_queue_ops(lib.npl_npu_queue_ops()) != 0:
        raise InstallError(f"cannot route the shim through torch_npu's task queue: {shim.npl_last_error().decode()}")
    shim.npl_set_npu_stream_resolver(ctypes.cast(lib.npl_npu_resolve_stream, ctypes.c_void_p).value)
    _bridge = lib


def stream_handle(stream) -> int:
    """The aclrtStream of a torch.npu.Stream (or any torch.Stream of the
    npu device), without draining torch_npu's task queue."""
    if _bridge is None:  # no shim installed: torch_npu's own route, which drains the queue
        import torch_npu

        if not isinstance(stream, torch_npu.npu.Stream):
            stream = device_stream("npu", stream)
        return int(stream.npu_stream)
    # torch.Stream's three fields: stream_id, device_index, device_type (an int, 20 = PrivateUse1)
    handle = _bridge.npl_npu_stream_handle(stream.stream_id, stream.device_index, int(stream.device_type))
    if not handle:
        raise RuntimeError(f"npu_lifetime: no aclrtStream for {stream}: {_bridge.npl_npu_last_error().decode()}")
    return handle
