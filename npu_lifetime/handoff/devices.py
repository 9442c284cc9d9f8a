"""Where the hand-off schedule runs: real CUDA streams with the shim as the
allocator, or the simulated device: CPU tensors over memory from the shim's
simulated runtime, with simdevice streams, so that peak memory and event
timing are those of the shim on both."""
from __future__ import annotations

import ctypes
import weakref

import torch

from .. import simdevice
from ..shim import api as shim


class CudaHandoffDevice:
    """torch.cuda with the shim installed (``npu_lifetime.install``)."""

    name = "cuda"

    def __init__(self) -> None:
        from ..shim.install import installed

        setup = installed()
        if setup is None or setup.device != "cuda":
            raise RuntimeError("the CUDA hand-off harness measures the shim: call npu_lifetime.install('cuda') first")
        self.Stream = torch.cuda.Stream
        self.Event = torch.cuda.Event
        self.stream = torch.cuda.stream

    def default_stream(self):
        return torch.cuda.default_stream()

    def current_stream(self):
        return torch.cuda.current_stream()

    def empty(self, n: int, stream) -> torch.Tensor:
        with torch.cuda.stream(stream):
            return torch.empty(n, device="cuda")

    def tensor(self, values: torch.Tensor) -> torch.Tensor:
        return values.to("cuda")

    def record_stream(self, t: torch.Tensor, stream) -> None:
        t.record_stream(stream)

    def record_use(self, t: torch.Tensor, stream) -> None:
        from ..recording import record_use

        record_use(t, stream)

    def progress(self, stream) -> None:
        """Real streams progress by themselves."""

    def sleep(self, cycles: int) -> None:
        if cycles:
            torch.cuda._sleep(cycles)

    def synchronize(self) -> None:
        torch.cuda.synchronize()


class SimHandoffDevice:
    """CPU tensors over the shim's simulated runtime.  Work on a stream
    "finishes" when the schedule says so (``progress``), which makes the
    consumer's lag, and so peak memory, deterministic."""

    name = "sim"

    def __init__(self) -> None:
        from ..recording import simulated_route

        self.Stream = simdevice.Stream
        self.Event = simdevice.Event
        self.stream = simdevice.stream
        self.route = simulated_route(self.handle)  # record_use on our buffers reaches the shim
        shim.select_runtime("sim")

    def default_stream(self):
        return simdevice.default_stream()

    def current_stream(self):
        return simdevice.current_stream()

    @staticmethod
    def handle(stream) -> int:
        return stream.handle + 1  # the shim's simulated runtime wants non-null handles

    def empty(self, n: int, stream) -> torch.Tensor:
        nbytes = 4 * n
        ptr = shim.alloc(nbytes, 0, self.handle(stream))
        if not ptr:
            raise MemoryError(f"the simulated runtime is out of memory: {shim.findings()}")
        t = torch.frombuffer((ctypes.c_byte * nbytes).from_address(ptr), dtype=torch.float32)
        weakref.finalize(t.untyped_storage(), shim.free, ptr, nbytes, 0, self.handle(stream))
        from ..sanitizer import watchers

        watchers.track_allocation(t, stream)
        return t

    def tensor(self, values: torch.Tensor) -> torch.Tensor:
        return values.clone()

    def record_stream(self, t: torch.Tensor, stream) -> None:
        from ..recording import record_stream

        record_stream(t, stream)
        shim.record_stream(t.untyped_storage().data_ptr(), self.handle(stream))

    def record_use(self, t: torch.Tensor, stream) -> None:
        from ..recording import record_use, shim_route

        with shim_route(self.route):
            record_use(t, stream)

    def progress(self, stream) -> None:
        shim.sim.complete(self.handle(stream))

    def sleep(self, cycles: int) -> None:
        """The consumer's lag is modelled by ``progress`` here."""

    def synchronize(self) -> None:
        simdevice.synchronize()
        shim.sim.complete_all()
