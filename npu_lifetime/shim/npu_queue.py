"""torch_npu's task queue and the shim (written against torch_npu's
published source, Ascend/pytorch; it has not run on an NPU here).

With the task queue on (``TASK_QUEUE_ENABLE`` unset, 1 or 2: torch_npu's
default), ops are launched from a host thread: a kernel the user queued may
still sit on the host when an event is recorded with ``aclrtRecordEvent``, so
the event can complete before the kernel runs and a block would be reused
under it.  torch_npu's own allocator records its events through that queue
(``c10_npu::queue::LaunchRecordEventTask``, hidden in libtorch_npu), and the
only queue-ordered routes visible from outside are C++ members of
torch_npu's classes (``NPUEvent::record``, ``NPUStream::stream()``, which
drains the queue) that the allocator's free path would call from torch_npu's
own threads (a deadlock risk that cannot be checked without an NPU).  So
``install("npu")`` requires the queue off and says how.
"""
from __future__ import annotations

import ctypes
import os
from pathlib import Path

from .native import library

STREAM_RESOLVER = "_ZNK7c10_npu9NPUStream6streamEv"  # c10_npu::NPUStream::stream() const


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


def check_supported() -> None:
    if queue_mode() == 0:
        return
    from .install import InstallError

    raise InstallError(
        f"install('npu') needs torch_npu's task queue off (it is at level {queue_mode()}: "
        "TASK_QUEUE_ENABLE is unset or 1/2). With the queue on, an event the shim records can complete "
        "before kernels still queued on the host, and a block would be reused under them. Set "
        "TASK_QUEUE_ENABLE=0 (or ASCEND_LAUNCH_BLOCKING=1) in the environment before starting Python."
    )


def _torch_npu_library() -> Path:
    import torch_npu

    return Path(torch_npu.__file__).resolve().parent / "lib" / "libtorch_npu.so"


def connect_stream_resolver() -> None:
    """Gives the shim torch_npu's NPUStream::stream(), which its record_stream
    and erase_stream hooks need to turn an NPUStream into an aclrtStream."""
    lib = ctypes.CDLL(str(_torch_npu_library()), mode=os.RTLD_NOLOAD | os.RTLD_NOW)
    resolver = ctypes.cast(getattr(lib, STREAM_RESOLVER), ctypes.c_void_p).value
    library().npl_set_npu_stream_resolver(resolver)
