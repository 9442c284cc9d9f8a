"""The stand-in CANN runtime's test controls (standin_* in libascendcl.so),
from a program running the real torch_npu on it (tests/platforms/npu_standin)."""
import ctypes
import os
import time

_lib = None


def library() -> ctypes.CDLL:
    """The loaded stand-in libascendcl.so (the one torch_npu uses)."""
    global _lib
    if _lib is None:
        lib = ctypes.CDLL(os.environ["NPU_STANDIN_LIBRARY"])
        signatures = {
            "standin_set_delay_us": (None, [ctypes.c_uint64]),
            "standin_pause_stream": (None, [ctypes.c_void_p]),
            "standin_resume_stream": (None, [ctypes.c_void_p]),
            "standin_drain": (None, []),
            "standin_tasks_executed": (ctypes.c_uint64, [ctypes.c_void_p]),
            "standin_tasks_pending": (ctypes.c_uint64, [ctypes.c_void_p]),
            "standin_call_count": (ctypes.c_uint64, [ctypes.c_char_p]),
            "standin_memory_in_use": (ctypes.c_uint64, [ctypes.c_int32]),
            "standin_hold_launches": (None, [ctypes.c_int]),
        }
        for name, (restype, argtypes) in signatures.items():
            function = getattr(lib, name)
            function.restype = restype
            function.argtypes = argtypes
        _lib = lib
    return _lib


def _handle(stream) -> int:
    """An aclrtStream from a torch_npu Stream, an int, or None (the default stream)."""
    return getattr(stream, "npu_stream", stream)


def set_delay_us(us: int) -> None:
    library().standin_set_delay_us(us)


def pause(stream) -> None:
    library().standin_pause_stream(_handle(stream))


def resume(stream) -> None:
    library().standin_resume_stream(_handle(stream))


def hold_launches(on: bool) -> None:
    """While on, work submitted by any thread but this one (torch_npu's task
    queue thread, when it is on) waits before reaching its stream."""
    library().standin_hold_launches(1 if on else 0)


def drain() -> None:
    library().standin_drain()


def executed(stream) -> int:
    return library().standin_tasks_executed(_handle(stream))


def pending(stream) -> int:
    return library().standin_tasks_pending(_handle(stream))


def calls(name: str) -> int:
    return library().standin_call_count(name.encode())


def memory_in_use(device: int = 0) -> int:
    return library().standin_memory_in_use(device)


def wait_for(predicate, timeout: float = 20.0) -> bool:
    """Polls ``predicate`` until it is true (True) or ``timeout`` seconds
    passed (False): work reaches the stand-in's streams on other threads."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True
