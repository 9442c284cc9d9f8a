"""The same stream API over the simulated device and real CUDA, so one test
body checks both (CUDA cases skip cleanly without a GPU)."""
import ctypes

import pytest
import torch

from npu_lifetime import simdevice
from npu_lifetime.sanitizer import watchers

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

    @staticmethod
    def ones(n):
        return torch.ones(n, device="cuda")

    @staticmethod
    def empty(n):
        return torch.empty(n, device="cuda")

    # 5 MiB: larger than any block other tests leave cached, so the caching
    # allocator hands the freed block straight back (best fit, same stream)
    REUSE_SIZES = (5 << 18, 5 << 18)

    @staticmethod
    def reused_empty(n):
        return torch.empty(n, device="cuda")

    @staticmethod
    def let_go():
        """record_use's native fallback holds a storage until its event fired,
        and lets it go at its next call: give the event time to fire (the
        device is idle), then let go, telling the sanitizer nothing."""
        import time

        from npu_lifetime.recording import FALLBACK

        time.sleep(0.05)
        FALLBACK.reclaim()


DEVICES = [
    pytest.param(SimDevice, id="sim"),
    pytest.param(
        CudaDevice, id="cuda",
        marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    ),
]
