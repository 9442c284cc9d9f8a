"""A multi-layer FSDP-like schedule: per layer, an all-gather buffer is
allocated and written on the all-gather stream and read (copied out) on the
compute stream; the layer's compute follows; a gradient buffer allocated on
the compute stream is read by the reduce-scatter stream.  Both buffers are
freed every layer, through one of the hand-offs in ``recipes.py``.

On the simulated device the consumer lags deterministically: the copy-out
finishes promptly, the layer's compute only when the next layer's copy-out
does; that lag is what makes record_stream hold memory longer.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Optional

import torch

from ..shim import api as shim


@dataclass
class HarnessResult:
    handoff: str
    outputs: list
    peak_active_bytes: int
    findings: list = field(default_factory=list)
    step_seconds: list = field(default_factory=list)

    @property
    def step_median_ms(self) -> Optional[float]:
        return statistics.median(self.step_seconds) * 1e3 if self.step_seconds else None

    @property
    def step_range_ms(self) -> Optional[tuple]:
        """(fastest, slowest) step, ms: the spread around the median."""
        return (min(self.step_seconds) * 1e3, max(self.step_seconds) * 1e3) if self.step_seconds else None

    @property
    def finding_kinds(self) -> list:
        return sorted({f.kind for f in self.findings})


class _Schedule:
    def __init__(self, device, handoff, layers: int, width: int, heavy: int, consumer_delay: int = 0) -> None:
        self.dev, self.h = device, handoff
        self.layers, self.width, self.heavy = layers, width, heavy
        self.consumer_delay = consumer_delay  # device cycles each consumer waits before its last read
        self.n = width * width
        self.ag = device.Stream()
        self.compute = device.default_stream()
        self.rs = device.Stream()
        gen = torch.Generator().manual_seed(0)
        self.shards = [device.tensor(torch.randn(self.n, generator=gen) / width) for _ in range(layers)]
        self.act = device.tensor(torch.eye(width))
        with device.stream(self.rs):
            self.reduced = device.empty(self.n, self.rs)
            self.reduced.zero_()
        self.rs.wait_stream(self.compute)

    def all_gather(self, i: int):
        dev, h = self.dev, self.h
        h.before_alloc(self.ag)
        buf = dev.empty(self.n, self.ag)
        with dev.stream(self.ag):
            self.ag.wait_stream(self.compute)  # shards were made on the compute stream
            buf.copy_(self.shards[i])
        self.compute.wait_stream(self.ag)
        h.before_last_use(buf, self.compute)
        with dev.stream(self.compute):
            dev.sleep(self.consumer_delay)  # a slow consumer: its last read runs late
            params = buf.view(self.width, self.width).clone()  # the copy-out: last read of buf
        h.after_last_use(buf, self.compute)
        dev.progress(self.ag)
        dev.progress(self.compute)  # the copy-out is done; the compute below is not
        with dev.stream(self.compute):
            act = self.act
            for _ in range(self.heavy):
                act = torch.tanh(act @ params)
            self.act = act
        h.drop(buf, self.ag, self.compute)

    def reduce_scatter(self):
        dev, h = self.dev, self.h
        h.before_alloc(self.compute)
        grad = dev.empty(self.n, self.compute)
        with dev.stream(self.compute):
            grad.copy_(self.act.reshape(-1))
        self.rs.wait_stream(self.compute)
        h.before_last_use(grad, self.rs)
        with dev.stream(self.rs):
            dev.sleep(self.consumer_delay)
            self.reduced.add_(grad, alpha=0.5)  # last read of grad
        h.after_last_use(grad, self.rs)
        dev.progress(self.rs)
        h.drop(grad, self.compute, self.rs)

    def step(self) -> None:
        for i in range(self.layers):
            self.all_gather(i)
            self.reduce_scatter()

    def finish(self) -> list:
        self.h.before_alloc(self.ag)
        self.h.before_alloc(self.compute)
        self.dev.synchronize()
        with self.dev.stream(self.rs):  # read each output on its own stream
            reduced = self.reduced.cpu().clone()
        return [self.act.cpu().clone(), reduced]


def check_arguments(device, handoff_class, **sizes: int) -> None:
    """TypeError / ValueError for what ``run_handoff`` cannot run, before
    anything runs."""
    from .recipes import Handoff

    from .devices import SimHandoffDevice, TorchHandoffDevice

    if not isinstance(device, (SimHandoffDevice, TorchHandoffDevice)):
        raise TypeError(f"device must be a SimHandoffDevice or CudaHandoffDevice/NpuHandoffDevice "
                        f"(npu_lifetime.handoff), not {type(device).__name__}")
    if not (isinstance(handoff_class, type) and issubclass(handoff_class, Handoff)):
        raise TypeError(f"handoff_class must be a Handoff subclass (e.g. npu_lifetime.handoff.RecordUseHandoff), "
                        f"not {handoff_class!r}")
    for name, value in sizes.items():
        least = 0 if name in ("heavy", "consumer_delay") else 1
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int >= {least}, not {type(value).__name__} {value!r}")
        if value < least:
            raise ValueError(f"{name} must be at least {least}, not {value}")


def run_handoff(
    device,
    handoff_class,
    layers: int = 6,
    width: int = 64,
    heavy: int = 3,
    steps: int = 1,
    sanitize: bool = True,
    consumer_delay: int = 0,
) -> HarnessResult:
    """Runs ``steps`` passes of the schedule with ``handoff_class`` on
    ``device`` (a ``SimHandoffDevice``, or a ``TorchHandoffDevice``:
    ``CudaHandoffDevice``, ``NpuHandoffDevice``), under the lifetime
    sanitizer when ``sanitize``; ``consumer_delay``: device cycles each
    consumer sleeps (``torch.<device>._sleep``) before its last read, a slow
    consumer (real devices; the simulated device's lag is its schedule).
    Returns outputs, peak active memory (live + waiting on events) and findings."""
    import gc

    from ..sanitizer import LifetimeSanitizer

    check_arguments(device, handoff_class, layers=layers, width=width, heavy=heavy, steps=steps,
                    consumer_delay=consumer_delay)
    sanitizer = LifetimeSanitizer(device.name, on_race="collect", warn_on_free=False) if sanitize else None
    handoff = handoff_class(device)
    if sanitizer is not None:
        sanitizer.enable()
    try:
        schedule = _Schedule(device, handoff, layers, width, heavy, consumer_delay)
        device.synchronize()
        shim.process_events()  # blocks a previous run left waiting have fired by now
        shim.reset_peak()
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            schedule.step()
            device.synchronize()
            times.append(time.perf_counter() - t0)
        peak = shim.stats()["active_bytes.all.peak"]
        outputs = schedule.finish()
        del schedule
        gc.collect()
    finally:
        if sanitizer is not None:
            sanitizer.disable()
    findings = [f for f in sanitizer.flush() if not getattr(f, "live", False)] if sanitizer else []
    return HarnessResult(handoff.name, outputs, peak, findings, times)
