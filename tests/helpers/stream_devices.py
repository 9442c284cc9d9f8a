"""The same stream API over the simulated device, real CUDA and the real
torch_npu, so one test body checks all three (CUDA cases skip cleanly
without a GPU; NPU cases without torch_npu: they run in the torch_npu
environment over the stand-in CANN runtime, tests/platforms/test_npu_suites.py)."""
import ctypes

import pytest
import torch

from npu_lifetime import simdevice
from npu_lifetime.recording import watchers

_POOL = (ctypes.c_float * 4096)()  # a toy allocator's memory: every tensor from it starts here


class SimDevice:
    name = "sim"
    Stream = simdevice.Stream
    stream = staticmethod(simdevice.stream)
    default_stream = staticmethod(simdevice.default_stream)
    synchronize = staticmethod(simdevice.synchronize)

    @staticmethod
    def ones(n):
        return torch.ones(n)

    @staticmethod
    def empty(n):
        return torch.empty(n)

    REUSE_SIZES = (1024, 512)  # the second owner takes half of the first's memory: a split block

    @staticmethod
    def let_go():
        """Nothing holds memory past its last reference here."""

    @staticmethod
    def reused_empty(n):
        """A tensor over the same memory every time, allocated on the current
        stream (a toy allocator that always reuses: the CPU allocator's reuse
        is not deterministic)."""
        t = torch.frombuffer(_POOL, dtype=torch.float32, count=n)
        watchers.track_allocation(t, simdevice.current_stream())
        return t


class CudaDevice:
    name = "cuda"
    Stream = torch.cuda.Stream
    stream = staticmethod(torch.cuda.stream)
    default_stream = staticmethod(lambda: torch.cuda.default_stream())
    synchronize = staticmethod(torch.cuda.synchronize)

    @classmethod
    def ones(cls, n):
        return torch.ones(n, device=cls.name)

    @classmethod
    def empty(cls, n):
        return torch.empty(n, device=cls.name)

    # 5 MiB: larger than any block other tests leave cached, so the caching
    # allocator hands the freed block straight back (best fit, same stream)
    REUSE_SIZES = (5 << 18, 5 << 18)
    reused_empty = empty

    @staticmethod
    def let_go():
        """record_use's torch-allocator fallback holds a storage until its event fired
        (under a sanitizer its calls let go, not its reaper thread): give the
        event time to fire (the device is idle), then let go, telling the
        sanitizer nothing."""
        import time

        from npu_lifetime.recording import FALLBACK

        time.sleep(0.05)
        FALLBACK.reclaim()


class NpuDevice(CudaDevice):
    """torch_npu's streams; on this project's machines, the real torch_npu
    over the stand-in CANN runtime (tests/platforms/npu_standin)."""

    name = "npu"

    @staticmethod
    def _npu():
        import torch_npu

        return torch_npu.npu

    Stream = staticmethod(lambda *a, **k: NpuDevice._npu().Stream(*a, **k))
    stream = staticmethod(lambda s: NpuDevice._npu().stream(s))
    default_stream = staticmethod(lambda: NpuDevice._npu().default_stream())
    synchronize = staticmethod(lambda: NpuDevice._npu().synchronize())


def _npu_available() -> bool:
    try:
        import torch_npu  # noqa: F401
    except ImportError:
        return False
    return torch_npu.npu.is_available()


DEVICES = [
    pytest.param(SimDevice, id="sim"),
    pytest.param(
        CudaDevice, id="cuda",
        marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    ),
    pytest.param(
        NpuDevice, id="npu",
        marks=pytest.mark.skipif(not _npu_available(), reason="needs torch_npu (tests/platforms/test_npu_suites.py runs these "
                                 "in the torch_npu environment over the stand-in CANN runtime)"),
    ),
]


def used_on_side(size: int = 8, dev=SimDevice, use=lambda x: x.sum()):
    """x, made on DEV's default stream, used (read, unless USE says otherwise)
    on a side stream that waited for it: the first half of every hand-off
    (record_use or the bug comes next)."""
    side = dev.Stream()
    x = dev.ones(size)
    side.wait_stream(dev.default_stream())
    with dev.stream(side):
        use(x)
    return x, side
