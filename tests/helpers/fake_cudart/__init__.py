"""A stand-in CUDA runtime for the torch-allocator fallback's raw-event path on CPU
(fake_cudart.c): built once per source version with the system C compiler,
loaded with ctypes, then handed to ``_holds.CudaRuntime`` by path, as
torch's libtorch_cuda.so is on a GPU machine."""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

SOURCE = Path(__file__).with_name("fake_cudart.c")
# the counters and failure switches of fake_cudart.c
CREATED, DESTROYED, RECORDS, QUERIES, VIOLATIONS, SET_DEVICE, SYNCS = range(7)
FAIL_CREATE, FAIL_RECORD, FAIL_QUERY = range(3)
NOT_READY, INVALID_HANDLE = 600, 400


def build() -> str:
    """The library's path (compiled if this source version was not yet)."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    out = Path(tempfile.gettempdir()) / f"npu_lifetime_fake_cudart_{digest}.so"
    if not out.exists():
        cc = os.environ.get("CC") or shutil.which("cc") or "gcc"
        partial = out.with_suffix(f".{os.getpid()}.tmp")
        subprocess.run([cc, "-std=c11", "-O1", "-fPIC", "-shared", "-pthread", "-Wall", "-Wextra", "-Werror",
                        str(SOURCE), "-o", str(partial)], check=True, capture_output=True, text=True)
        os.replace(partial, out)
    return str(out)


class FakeCudart:
    """The loaded library and its controls; ``reset()`` between tests."""

    def __init__(self) -> None:
        self.path = build()
        self.lib = ctypes.CDLL(self.path)
        for name in ("fake_run", "fake_stream_device"):
            getattr(self.lib, name).argtypes = [ctypes.c_long, ctypes.c_long]
        for name in ("fake_queued", "fake_done", "fake_count"):
            getattr(self.lib, name).restype = ctypes.c_long
        self.lib.fake_queued.argtypes = self.lib.fake_done.argtypes = [ctypes.c_long]
        self.lib.fake_capture.argtypes = [ctypes.c_long, ctypes.c_int]

    def reset(self) -> None:
        self.lib.fake_reset()

    def run(self, handle: int, n: int = -1) -> None:
        self.lib.fake_run(handle, n)

    def capture(self, handle: int, on: bool = True) -> None:
        self.lib.fake_capture(handle, int(on))

    def capture_underway(self, on: bool = True) -> None:
        self.lib.fake_capture_underway(int(on))

    def fail(self, which: int, err: int) -> None:
        self.lib.fake_fail(which, err)

    def count(self, which: int) -> int:
        return self.lib.fake_count(which)

    def queued(self, handle: int) -> int:
        return self.lib.fake_queued(handle)

    def stream_device(self, handle: int, device: int) -> None:
        self.lib.fake_stream_device(handle, device)

    def current_device(self) -> int:
        return self.lib.fake_current_device()

    def query_sleep(self, seconds: float) -> None:
        self.lib.fake_query_sleep_us(int(seconds * 1e6))

    def last_error(self) -> int:
        return self.lib.fake_last_error()

    def set_last_error(self, err: int) -> None:
        self.lib.fake_set_last_error(err)
