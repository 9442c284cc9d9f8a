"""torch's GPU trace delivered without torch's import per event: the GPU
trace bridge (``allocator_shim/torch_bridge/gpu_trace_bridge.cpp``).

With the trace active, torch calls its trace interpreter at every CUDA
allocation, free, event and synchronisation, and torch's interpreter imports
``torch.cuda`` each time before it looks up
``_gpu_trace.<Registry>.fire_callbacks``.  The bridge is an interpreter that
makes the same lookups from the module object it holds and calls the same
``fire_callbacks`` with the same arguments, so every subscriber (ours,
CSAN's) is served as before; device types other than CUDA and HIP, and
every method that is not a trace, stay torch's.

The CUDA backend installs it right after activating torch's trace
(``backends.py``).  It is built once per torch build and interpreter
(``shim/bridge.py``'s cache); where it cannot be built or loaded, torch's own
delivery stays, with a warning.  ``NPU_LIFETIME_NATIVE=0`` or
``NPU_LIFETIME_TRACE_BRIDGE=0`` leaves it out.
"""
from __future__ import annotations

import ctypes
import os
import threading
import warnings
from typing import Optional

from ..native_parts import ENABLED

# the bridge's registries, in its order (npl_trace_bridge_fire's kind)
KINDS = ("event_creation", "event_deletion", "event_record", "event_wait", "memory_allocation",
         "memory_deallocation", "stream_creation", "device_synchronization", "stream_synchronization",
         "event_synchronization")
# c10::DeviceType's numbers, for the test entry
CUDA, HIP, XPU = 1, 6, 12
# npl_trace_bridge_install's answer when the trace's interpreter is someone else's
LEFT_OUT = 2

_lock = threading.Lock()
_library: Optional[tuple] = None  # (PyDLL, CDLL) over the one loaded library
_failure: Optional[str] = None


def wanted() -> bool:
    return ENABLED and os.environ.get("NPU_LIFETIME_TRACE_BRIDGE", "1") != "0"


def install() -> bool:
    """With torch's GPU trace active: the bridge as the trace's interpreter.
    True if it is (now or already); False where it is turned off or could not
    be built or loaded (``failure()`` says why)."""
    if not wanted():
        return False
    import torch.cuda

    with _lock:
        library = _load()
        if library is None:
            return False
        if library[0].npl_trace_bridge_install(torch.cuda) == LEFT_OUT:  # raises if torch's trace is not active
            warnings.warn("npu_lifetime: the GPU trace bridge was left out: the trace's interpreter is not "
                          "torch's own (another library replaced it)", RuntimeWarning, stacklevel=2)
            return False
        return True


def installed() -> bool:
    """Whether the trace's interpreter is the bridge's now."""
    return _library is not None and bool(_library[1].npl_trace_bridge_installed())


def failure() -> Optional[str]:
    """Why the bridge could not be built or loaded in this process, if it could not."""
    return _failure


def fire(kind: str, *args: int, device_type: int = CUDA, through_torch: bool = False) -> None:
    """What torch's C++ does at a traced event (tests): the trace's current
    interpreter, or torch's own, called for ``kind`` without the GIL."""
    if _library is None:
        raise RuntimeError("the GPU trace bridge is not loaded")
    first, second = (list(args) + [0, 0])[:2]
    if _library[1].npl_trace_bridge_fire(int(through_torch), KINDS.index(kind), device_type, first, second) != 0:
        raise RuntimeError("no GPU trace interpreter to call")


def _load() -> Optional[tuple]:
    """The library, built and loaded once (lock held); None where it cannot be."""
    global _library, _failure
    if _library is not None or _failure is not None:
        return _library
    from ..shim import bridge

    try:
        path = bridge.build(name=bridge.GPU_TRACE_BRIDGE)
        with_gil, without_gil = ctypes.PyDLL(str(path)), ctypes.CDLL(str(path))
    except (bridge.BridgeUnavailable, OSError) as error:
        _failure = str(error)
        warnings.warn(f"npu_lifetime: torch's GPU trace is delivered by torch's own Python layer, "
                      f"slower: {error}", RuntimeWarning, stacklevel=3)
        return None
    with_gil.npl_trace_bridge_install.argtypes = [ctypes.py_object]
    with_gil.npl_trace_bridge_install.restype = ctypes.c_int
    without_gil.npl_trace_bridge_installed.restype = ctypes.c_int
    without_gil.npl_trace_bridge_fire.argtypes = [ctypes.c_int] * 3 + [ctypes.c_size_t] * 2
    without_gil.npl_trace_bridge_fire.restype = ctypes.c_int
    _library = (with_gil, without_gil)
    return _library
