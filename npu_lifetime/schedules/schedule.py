"""A small public language for multi-stream programs: a ``Schedule`` is the
sequence of steps a host issues.  Streams are ``0 .. streams-1`` (0 is the
default stream), events ``0 .. events-1``, and tensors are named by the
integer the step that created them gives them (``Alloc`` or ``View``).

``repr(schedule)`` is valid Python once ``from npu_lifetime.schedules import *``
has run, so a failing schedule can be pasted back as a reproducer.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union


@dataclass(frozen=True, slots=True)
class Alloc:
    """A new storage on ``stream`` at ``address`` (addresses may be reused)."""
    tensor: int
    stream: int
    address: int
    size: int = 1


@dataclass(frozen=True, slots=True)
class View:
    """``tensor`` is a view of ``base``: same storage, same lifetime state."""
    tensor: int
    base: int


@dataclass(frozen=True, slots=True)
class Read:
    tensor: int
    stream: int


@dataclass(frozen=True, slots=True)
class Write:
    tensor: int
    stream: int


@dataclass(frozen=True, slots=True)
class Free:
    """The last reference to the tensor's storage is dropped."""
    tensor: int


@dataclass(frozen=True, slots=True)
class RecordStream:
    tensor: int
    stream: int


@dataclass(frozen=True, slots=True)
class EraseStream:
    tensor: int
    stream: int


@dataclass(frozen=True, slots=True)
class RecordUse:
    tensor: int
    stream: int


@dataclass(frozen=True, slots=True)
class RecordEvent:
    event: int
    stream: int


@dataclass(frozen=True, slots=True)
class WaitEvent:
    """``stream`` waits for ``event`` (GPU-side)."""
    stream: int
    event: int


@dataclass(frozen=True, slots=True)
class SyncEvent:
    """The host waits for ``event``."""
    event: int


@dataclass(frozen=True, slots=True)
class QueryEvent:
    """``event.query()`` returned True on the host."""
    event: int


@dataclass(frozen=True, slots=True)
class WaitStream:
    """``waiter.wait_stream(waitee)``."""
    waiter: int
    waitee: int


@dataclass(frozen=True, slots=True)
class SyncStream:
    stream: int


@dataclass(frozen=True, slots=True)
class SyncDevice:
    pass


Step = Union[
    Alloc, View, Read, Write, Free, RecordStream, EraseStream, RecordUse,
    RecordEvent, WaitEvent, SyncEvent, QueryEvent, WaitStream, SyncStream, SyncDevice,
]

TENSOR_STEPS = (Read, Write, Free, RecordStream, EraseStream, RecordUse)


class ScheduleError(ValueError):
    """A schedule that names a stream, event or tensor it does not have."""


@dataclass(frozen=True)
class Schedule:
    streams: int
    events: int
    steps: tuple

    def __post_init__(self) -> None:
        object.__setattr__(self, "steps", tuple(self.steps))
        self.validate()

    def validate(self) -> None:
        tensors: set = set()
        for index, step in enumerate(self.steps):
            problem = self._problem(step, tensors)
            if problem:
                raise ScheduleError(f"step {index} {step!r}: {problem}")

    def _problem(self, step, tensors: set) -> str:
        for name in ("stream", "waiter", "waitee"):
            value = getattr(step, name, 0)
            if not 0 <= value < self.streams:
                return f"stream {value} out of range 0..{self.streams - 1}"
        if hasattr(step, "event") and not 0 <= step.event < self.events:
            return f"event {step.event} out of range 0..{self.events - 1}"
        if isinstance(step, (Alloc, View)):
            if step.tensor in tensors:
                return f"tensor {step.tensor} already named"
            if isinstance(step, View) and step.base not in tensors:
                return f"view of unknown tensor {step.base}"
            tensors.add(step.tensor)
        elif isinstance(step, TENSOR_STEPS) and step.tensor not in tensors:
            return f"unknown tensor {step.tensor}"
        return ""

    def to_python(self) -> str:
        """A runnable snippet that rebuilds this schedule and compares the
        model with the oracle on it."""
        steps = ",\n".join(f"        {step!r}" for step in self.steps)
        return (
            "from npu_lifetime.schedules import *\n\n"
            f"schedule = Schedule(streams={self.streams}, events={self.events}, steps=(\n"
            f"{steps},\n    ))\n"
            "print(compare(schedule))\n"
        )
