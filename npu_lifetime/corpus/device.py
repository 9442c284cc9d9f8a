"""The device a corpus program runs on: the stream module (``torch.cuda``,
``torch.npu`` or the simulated ``simdevice``), where its tensors live, and
the two things the programs need beyond torch's stream API: pinned host
memory and a slow kernel that makes a race show in the data on a real
device (the simulated device runs work at once, so there it does nothing).
"""
from __future__ import annotations

import torch

from .. import simdevice

# A slow kernel's length: _sleep cycles.  On a GPU 50M cycles are about 25 ms,
# far longer than the host needs to free a buffer and hand it out again; on
# the stand-in CANN runtime a cycle is a nanosecond.
SLOW_CYCLES = {"cuda": 50_000_000, "npu": 50_000_000}
DEVICES = ("sim", "cuda", "npu")


class CorpusDevice:
    def __init__(self, name: str, slow: bool = False) -> None:
        if name not in DEVICES:
            raise ValueError(f"device must be one of {', '.join(DEVICES)}, not {name!r}")
        self.name = name
        self.slow_kernels = slow and name != "sim"
        if name == "sim":
            self.module, self.type = simdevice, "cpu"
        else:
            if name == "npu":
                import torch_npu  # noqa: F401  (registers torch.npu)
            self.module, self.type = getattr(torch, name), name

    def pinned(self, t: torch.Tensor) -> torch.Tensor:
        """Host memory a non-blocking copy really overlaps with (page-locked)."""
        return t if self.name == "sim" else t.pin_memory()

    def slow(self) -> None:
        """A long kernel on the current stream (a slow consumer or producer)."""
        if self.slow_kernels:
            self.module._sleep(SLOW_CYCLES[self.name])

    def record_stream(self, t: torch.Tensor, stream) -> None:
        """``t.record_stream(stream)``; on the simulated device through
        npu_lifetime, as its streams are not torch's."""
        if self.name == "sim":
            from ..recording import record_stream

            record_stream(t, stream)
        else:
            t.record_stream(stream)

    def synchronize(self) -> None:
        self.module.synchronize()


def same(t: torch.Tensor, value: float) -> bool:
    """Every element equals ``value`` (NaN, the debug shim's poison, never
    does), with kernels every device has (the stand-in CANN runtime has no
    ``all``)."""
    return int((t != value).sum()) == 0


def _cudart():
    """The CUDA runtime torch loaded, for a library that launches on raw pointers."""
    import ctypes

    torch.cuda.init()
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "libcudart.so" in line}
    if not paths:
        raise RuntimeError("no libcudart is loaded in this process")
    return ctypes.CDLL(sorted(paths)[0])


class RawLibrary:
    """A library that gets only raw pointers and launches on a stream of its
    own choosing (cuDNN's handle stream, NCCL, a custom kernel): torch sees
    neither its reads nor its writes.  On the simulated device it runs at
    once, as CPU memory operations."""

    def __init__(self, dev: CorpusDevice) -> None:
        if dev.name not in ("sim", "cuda"):
            raise ValueError(f"the raw-pointer library runs on sim and cuda, not {dev.name}")
        self.dev = dev
        self.cudart = _cudart() if dev.name == "cuda" else None

    def _check(self, status: int, call: str) -> None:
        if status != 0:
            raise RuntimeError(f"{call} failed with CUDA error {status}")

    def fill(self, ptr: int, byte: int, nbytes: int, stream) -> None:
        import ctypes

        if self.cudart is None:
            ctypes.memset(ptr, byte, nbytes)
            return
        self._check(self.cudart.cudaMemsetAsync(ctypes.c_void_p(ptr), byte, ctypes.c_size_t(nbytes),
                                                ctypes.c_void_p(stream.cuda_stream)), "cudaMemsetAsync")

    def copy(self, dst: int, src: int, nbytes: int, stream) -> None:
        import ctypes

        if self.cudart is None:
            ctypes.memmove(dst, src, nbytes)
            return
        device_to_device = 3
        self._check(self.cudart.cudaMemcpyAsync(ctypes.c_void_p(dst), ctypes.c_void_p(src), ctypes.c_size_t(nbytes),
                                                device_to_device, ctypes.c_void_p(stream.cuda_stream)),
                    "cudaMemcpyAsync")
