"""Debug mode on the repo's hand-offs, on the shim's simulated runtime.

One buffer goes through a hand-off's own hooks (``recipes.py``), exactly as
the harness calls them, on a device whose streams, events and buffers are
the shim's simulated runtime (events really recorded, GPU-side waits really
ordering the streams).  The consumer's last read is a queued kernel that
runs late: after the host dropped the buffer, once everything queued before
it ran and the owner stream ran on.  The shim is in debug mode, so a block
that became free before the read is filled with the poison on the owner
stream: a broken hand-off reads NaN, every run; a correct one reads its
data, because the free waits for the read (record_use, record_stream) or
the owner's stream waits for it before the fill (the recipe).
"""
from __future__ import annotations

import ctypes
import gc
import itertools
import struct
import weakref
from dataclasses import dataclass

from ..shim import api as shim
from .hook_device import HookDevice

_N = 1024  # floats
_handles = itertools.count(0xD000)


class _Stream:
    def __init__(self, device: "_SimRuntimeDevice") -> None:
        self.device, self.handle = device, next(_handles)

    def wait_event(self, event: "_Event") -> None:
        shim.sim.wait_event(self.handle, event.handle)

    def wait_stream(self, other: "_Stream") -> None:
        self.wait_event(other.record_event())

    def record_event(self) -> "_Event":
        event = _Event()
        event.record(self)
        return event


class _Event:
    handle = 0

    def record(self, stream: _Stream) -> None:
        self.handle = shim.sim.record_event(stream.handle)


class _Buffer:
    """Device memory from the shim, freed when its last reference goes."""

    def __init__(self, owner: _Stream) -> None:
        self.nbytes = 4 * _N
        self.ptr = shim.alloc(self.nbytes, 0, owner.handle)
        ctypes.memmove(self.ptr, struct.pack(f"{_N}f", *([1.0] * _N)), self.nbytes)  # the producer's write
        weakref.finalize(self, shim.free, self.ptr, self.nbytes, 0, owner.handle)


class _SimRuntimeDevice(HookDevice):
    """The device API the hand-offs use, over the shim's simulated runtime."""

    def __init__(self) -> None:
        self.owner, self.consumer = _Stream(self), _Stream(self)
        self._current = self.consumer

    def Event(self) -> _Event:  # noqa: N802  (the device modules' name)
        return _Event()

    def record_use(self, buf: _Buffer, stream: _Stream) -> None:
        shim.record_use(buf.ptr, stream.handle)

    def record_stream(self, buf: _Buffer, stream: _Stream) -> None:
        shim.record_stream(buf.ptr, stream.handle)


@dataclass(frozen=True)
class LateRead:
    handoff: str
    saw: str  # "data", "poison" (NaN), or "other" (another owner's bytes)

    @property
    def failed(self) -> bool:
        return self.saw != "data"


def late_read(handoff_class, debug: bool = True) -> LateRead:
    """Runs one buffer through ``handoff_class`` with the shim in debug mode
    (``debug=False``: without it, for contrast; the mode is restored after)
    and reports what the late read saw."""
    if shim.runtime_name() not in ("sim", "none"):
        raise RuntimeError("the late-read check runs on the shim's simulated runtime; this process uses "
                           f"{shim.runtime_name()!r}")
    shim.select_runtime("sim")
    was_debug = shim.debug()
    shim.set_debug(debug, 1 << 20)
    try:
        dev = _SimRuntimeDevice()
        h = handoff_class(dev)
        owner, consumer = dev.owner, dev.consumer
        h.before_alloc(owner)
        buf = _Buffer(owner)
        consumer.wait_stream(owner)
        shim.sim.complete(owner.handle)  # the producer ran
        h.before_last_use(buf, consumer)
        read = shim.sim.launch(consumer.handle)  # the consumer's last read, queued
        h.after_last_use(buf, consumer)
        h.drop(buf, owner, consumer)
        ptr = buf.ptr
        del buf
        gc.collect()
        h.before_alloc(owner)
        # the device runs late: the consumer up to its read, then the owner on
        shim.sim.complete_to(consumer.handle, read - 1)
        shim.process_events()
        shim.sim.complete(owner.handle)
        seen = struct.unpack(f"{_N}f", ctypes.string_at(ptr, 4 * _N))  # the read runs now
        shim.sim.complete(consumer.handle)
        shim.sim.complete(owner.handle)
        shim.process_events()
    finally:
        shim.set_debug(was_debug)
    if all(v == 1.0 for v in seen):
        return LateRead(handoff_class.name, "data")
    return LateRead(handoff_class.name, "poison" if all(v != v for v in seen) else "other")
