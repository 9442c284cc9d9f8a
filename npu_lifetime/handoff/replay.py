"""A hand-off's own hooks replayed for one buffer as a schedule, and run on
the simulated executor (``npu_lifetime.schedules``) with the consumer
stream delayed as long as the program allows: whether the late read can see
the next owner's data.

The hooks of a ``Handoff`` (recipes.py) are called exactly as the harness
calls them, on a device whose streams, events and buffers write schedule
steps instead of running work.  A buffer is freed when its last Python
reference goes, so a stash that keeps one alive delays the ``Free`` just as
it delays the real free.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

from ..schedules import (Alloc, Free, Read, RecordEvent, RecordStream, RecordUse, Schedule, WaitEvent,
                         WaitStream, Write, delay_stream, execute)
from .hook_device import HookDevice

OWNER, CONSUMER = 1, 0  # stream 0 is the default (compute) stream, as in the harness
_ADDRESS = 0


class _Stream:
    def __init__(self, device: "_ScheduleDevice", index: int) -> None:
        self.device, self.index = device, index

    def wait_event(self, event: "_Event") -> None:
        self.device.steps.append(WaitEvent(self.index, event.index))

    def wait_stream(self, other: "_Stream") -> None:
        self.device.steps.append(WaitStream(self.index, other.index))


class _Event:
    def __init__(self, device: "_ScheduleDevice") -> None:
        self.device = device
        self.index = device.events
        device.events += 1

    def record(self, stream=None) -> None:
        stream = stream or self.device.current_stream()
        self.device.steps.append(RecordEvent(self.index, stream.index))


class _Buffer:
    def __init__(self, device: "_ScheduleDevice", tensor: int) -> None:
        self.tensor = tensor
        weakref.finalize(self, device.steps.append, Free(tensor))


class _ScheduleDevice(HookDevice):
    """The device API the hand-offs use (``Event``, ``stream``,
    ``current_stream``, ``record_use``, ``record_stream``)."""

    def __init__(self) -> None:
        self.steps: list = []
        self.events = 0
        self.streams = [_Stream(self, CONSUMER), _Stream(self, OWNER)]
        self._current = self.streams[CONSUMER]

    def Event(self) -> _Event:  # noqa: N802  (the device modules' name)
        return _Event(self)

    def record_use(self, buf: _Buffer, stream: _Stream) -> None:
        self.steps.append(RecordUse(buf.tensor, stream.index))

    def record_stream(self, buf: _Buffer, stream: _Stream) -> None:
        self.steps.append(RecordStream(buf.tensor, stream.index))


@dataclass(frozen=True)
class Replay:
    schedule: Schedule
    corrupted: bool  # the consumer's read ran after the block went to its next owner


def replay(handoff_class) -> Replay:
    """One buffer through ``handoff_class``'s hooks: the owner writes it, the
    consumer reads it last and goes on with other work, the buffer is
    dropped, the owner allocates at the same address and writes there."""
    dev = _ScheduleDevice()
    h = handoff_class(dev)
    owner, consumer = dev.streams[OWNER], dev.streams[CONSUMER]
    other = _Buffer(dev, 2)  # the consumer's unrelated work
    dev.steps += [Alloc(2, CONSUMER, address=1)]
    h.before_alloc(owner)
    buf = _Buffer(dev, 0)
    dev.steps += [Alloc(0, OWNER, _ADDRESS), Write(0, OWNER), WaitStream(CONSUMER, OWNER)]
    h.before_last_use(buf, consumer)
    dev.steps.append(Read(0, CONSUMER))  # the last read
    h.after_last_use(buf, consumer)
    dev.steps.append(Write(2, CONSUMER))  # the consumer goes on
    h.drop(buf, owner, consumer)
    del buf  # the harness lets go of its reference here
    h.before_alloc(owner)
    dev.steps += [Alloc(1, OWNER, _ADDRESS), Write(1, OWNER)]
    del other
    schedule = Schedule(streams=2, events=max(dev.events, 1), steps=tuple(dev.steps))
    execution = execute(schedule, delay_stream(CONSUMER), allocator_waits=False)
    return Replay(schedule, bool(execution.corrupted))
