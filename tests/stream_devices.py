"""The same stream API over the simulated device and real CUDA, so one test
body checks both (CUDA cases skip cleanly without a GPU)."""
import pytest
import torch

from npu_lifetime import simdevice


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


DEVICES = [
    pytest.param(SimDevice, id="sim"),
    pytest.param(
        CudaDevice, id="cuda",
        marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    ),
]
