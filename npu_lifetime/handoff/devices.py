"""Where the hand-off schedule runs: a real device's streams (CUDA, or an
Ascend NPU through torch_npu) with the shim as the allocator, or the
simulated device: CPU tensors over memory from the shim's simulated
runtime, with simdevice streams; peak memory and event timing are the
shim's everywhere."""
from __future__ import annotations

import ctypes
import weakref

import torch

from .. import simdevice
from ..shim import api as shim


class TorchHandoffDevice:
    """A torch device type with the shim installed (``npu_lifetime.install``):
    ``cuda``, or ``npu`` (torch_npu).  Streams, events and the slow
    consumer's ``_sleep`` are that device module's (``torch.cuda``,
    ``torch.npu``)."""

    # What each consumer sleeps before its last read when the table checks
    # what the device's own late read sees (table.py): ``_sleep`` cycles, far
    # longer than the host needs to free the buffer and the shim to poison it.
    # On the stand-in CANN runtime a cycle is a nanosecond (50 ms); on a GPU
    # 20M cycles are about 10 ms.
    LATE_READ_DELAY = {"cuda": 20_000_000, "npu": 50_000_000}

    def __init__(self, device_type: str = "cuda") -> None:
        from ..shim.state import installed

        if device_type not in self.LATE_READ_DELAY:
            raise ValueError(f"device_type must be one of {sorted(self.LATE_READ_DELAY)}, not {device_type!r}")
        setup = installed()
        if setup is None or setup.device != device_type:
            raise RuntimeError(f"the {device_type} hand-off harness measures the shim: call "
                               f"npu_lifetime.install({device_type!r}) first")
        self.name = device_type
        self.module = getattr(torch, device_type)  # torch.npu: registered by torch_npu
        self.Event = self.module.Event
        self.stream = self.module.stream
        self.late_read_delay = self.LATE_READ_DELAY[device_type]

    def Stream(self):  # noqa: N802  (the device modules' name)
        return self.module.Stream()

    def default_stream(self):
        return self.module.default_stream()

    def current_stream(self):
        return self.module.current_stream()

    def empty(self, n: int, stream) -> torch.Tensor:
        with self.module.stream(stream):
            return torch.empty(n, device=self.name)

    def tensor(self, values: torch.Tensor) -> torch.Tensor:
        return values.to(self.name)

    def record_stream(self, t: torch.Tensor, stream) -> None:
        t.record_stream(stream)

    def record_use(self, t: torch.Tensor, stream) -> None:
        from ..recording import record_use

        record_use(t, stream)

    def progress(self, stream) -> None:
        """Real streams progress by themselves."""

    def sleep(self, cycles: int) -> None:
        if cycles:
            self.module._sleep(cycles)

    def synchronize(self) -> None:
        self.module.synchronize()


class CudaHandoffDevice(TorchHandoffDevice):
    """torch.cuda with the shim installed."""

    def __init__(self) -> None:
        super().__init__("cuda")


class NpuHandoffDevice(TorchHandoffDevice):
    """torch.npu (torch_npu) with the shim installed."""

    def __init__(self) -> None:
        super().__init__("npu")


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
        from ..recording import watchers

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
