"""A small public language for multi-stream programs: a ``Schedule`` is the
sequence of steps a host issues.  Streams are ``0 .. streams-1`` (0 is the
default stream; stream ``s`` is on device ``s % devices``), events
``0 .. events-1``, and tensors are named by the integer the step that
created them gives them (``Alloc``, ``Adopt`` or ``View``).  Addresses and
sizes are in abstract cells: two storages overlap when their
``[address, address + size)`` ranges do.

Host threads.  The steps are the issue order of every host thread
together; thread 0 (the main thread) issues from the start.  ``Spawn(t)``:
the current thread starts thread ``t``, which begins ordered after what
its starter has waited for.  ``Switch(t)``: a running thread ``t`` issues
the steps that follow.  ``Join(t)``: the current thread waits for thread
``t`` to end and is then ordered after what ``t`` waited for; ``t`` may be
spawned again.  A host wait (``SyncStream``, ``SyncEvent``, ``QueryEvent``,
``SyncDevice``) orders only what its own thread issues later (and, through
``Spawn`` and ``Join``, what the threads it starts and joins issue): a sync
on one thread covers nothing another thread frees.  Device order is shared:
a stream runs what any thread queued on it in issue order.

``repr(schedule)`` is valid Python once ``from npu_lifetime.schedules import *``
has run, so a failing schedule can be pasted back as a reproducer.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union


@dataclass(frozen=True, slots=True)
class Alloc:
    """A new storage on ``stream`` at ``address`` (addresses may be reused)."""
    tensor: int
    stream: int
    address: int
    size: int = 1


@dataclass(frozen=True, slots=True)
class Adopt:
    """A storage that existed, allocated on ``stream``, before tracking began
    (a tensor made before the sanitizer was enabled): ordered before
    everything, with nothing known of its earlier uses."""
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
    """The host waits for every stream of ``device`` (of every device if None)."""
    device: Optional[int] = None


@dataclass(frozen=True, slots=True)
class DeleteEvent:
    """The event is destroyed; its number then names a new, unrecorded event."""
    event: int


@dataclass(frozen=True, slots=True)
class Spawn:
    """The current host thread starts thread ``thread`` (not running; not 0)."""
    thread: int


@dataclass(frozen=True, slots=True)
class Switch:
    """Running thread ``thread`` issues the steps that follow."""
    thread: int


@dataclass(frozen=True, slots=True)
class Join:
    """The current thread joins running thread ``thread`` (neither itself nor 0)."""
    thread: int


@dataclass(frozen=True, slots=True)
class Op:
    """One op queued on ``stream`` that reads ``reads`` and writes ``writes``
    (each storage once: a write if any of its tensors is written, in the
    order its tensors first appear in ``reads + writes``), and that issues
    device events of its own: ``before`` its kernels (waits by ``stream``,
    records on other streams: a copy's or a collective's barrier) and
    ``after`` them (records on ``stream``, waits by other streams, host
    synchronisations: ``.item()``, a blocking copy to the host).

    A sanitizer sees the op's accesses only when it returns, after all of
    these events: it must put them back in between."""
    stream: int
    reads: tuple = ()
    writes: tuple = ()
    before: tuple = ()
    after: tuple = ()


Step = Union[
    Alloc, Adopt, View, Read, Write, Free, RecordStream, EraseStream, RecordUse,
    RecordEvent, WaitEvent, SyncEvent, QueryEvent, WaitStream, SyncStream, SyncDevice,
    DeleteEvent, Spawn, Switch, Join, Op,
]

TENSOR_STEPS = (Read, Write, Free, RecordStream, EraseStream, RecordUse)
HOST_SYNCS = (SyncStream, SyncEvent, QueryEvent, SyncDevice)
THREAD_STEPS = (Spawn, Switch, Join)
# what an op may issue before its kernels, and after them
_BEFORE = (WaitEvent, RecordEvent)
_AFTER = (RecordEvent, WaitEvent, *HOST_SYNCS)


class ScheduleError(ValueError):
    """A schedule that names a stream, event, tensor or thread it does not have."""


class _Threads:
    """Which host threads run, and which issues, while a schedule is checked."""

    def __init__(self) -> None:
        self.running = {0}
        self.current = 0

    def problem(self, step) -> str:
        t = step.thread
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            return f"a thread is an int >= 0, not {type(t).__name__} {t!r}"
        if isinstance(step, Spawn):
            if t in self.running:
                return f"thread {t} is already running"
            self.running.add(t)
        elif t not in self.running:
            return f"thread {t} is not running"
        elif isinstance(step, Switch):
            self.current = t
        elif t in (0, self.current):
            return "thread 0 and the current thread cannot be joined"
        else:
            self.running.discard(t)
        return ""


@dataclass(frozen=True)
class Schedule:
    streams: int
    events: int
    steps: tuple
    devices: int = 1

    def __post_init__(self) -> None:
        for name, least in (("streams", 1), ("events", 0), ("devices", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"Schedule: {name} must be an int, not {type(value).__name__} {value!r}")
            if value < least:
                raise ScheduleError(f"Schedule: {name} must be at least {least}, not {value}")
        object.__setattr__(self, "steps", tuple(self.steps))
        self.validate()

    def device_of(self, stream: int) -> int:
        return stream % self.devices

    def validate(self) -> None:
        tensors: set = set()
        threads = _Threads()
        for index, step in enumerate(self.steps):
            problem = threads.problem(step) if isinstance(step, THREAD_STEPS) else self._problem(step, tensors)
            if problem:
                raise ScheduleError(f"step {index} {step!r}: {problem}")

    def _problem(self, step, tensors: set) -> str:
        for name in ("stream", "waiter", "waitee"):
            value = getattr(step, name, 0)
            if not 0 <= value < self.streams:
                return f"stream {value} out of range 0..{self.streams - 1}"
        if hasattr(step, "event") and not 0 <= step.event < self.events:
            return f"event {step.event} out of range 0..{self.events - 1}"
        if isinstance(step, SyncDevice) and step.device is not None and not 0 <= step.device < self.devices:
            return f"device {step.device} out of range 0..{self.devices - 1}"
        if isinstance(step, Op):
            return self._op_problem(step, tensors)
        if isinstance(step, (Alloc, Adopt)):
            for name, least, unit in (("address", 0, ""), ("size", 1, " cell")):
                value = getattr(step, name)
                if isinstance(value, bool) or not isinstance(value, int):
                    return f"{name} must be an int (cells), not {type(value).__name__} {value!r}"
                if value < least:
                    return f"{name} must be at least {least}{unit}, not {value}"
        if isinstance(step, (Alloc, Adopt, View)):
            if step.tensor in tensors:
                return f"tensor {step.tensor} already named"
            if isinstance(step, View) and step.base not in tensors:
                return f"view of unknown tensor {step.base}"
            tensors.add(step.tensor)
        elif isinstance(step, TENSOR_STEPS) and step.tensor not in tensors:
            return f"unknown tensor {step.tensor}"
        return ""

    def _op_problem(self, op: Op, tensors: set) -> str:
        unknown = [t for t in (*op.reads, *op.writes) if t not in tensors]
        if unknown:
            return f"unknown tensor {unknown[0]}"
        for inner in (*op.before, *op.after):
            if isinstance(inner, THREAD_STEPS):
                return f"an op issues device events and host waits, not {inner!r}"
            problem = self._problem(inner, tensors)
            if problem:
                return f"in the op: {problem}"
        for inner in op.before:
            own = getattr(inner, "stream", None) == op.stream
            if not isinstance(inner, _BEFORE) or (own != isinstance(inner, WaitEvent)):
                return f"before its kernels an op only waits on its stream or records on others, not {inner!r}"
        for inner in op.after:
            if not isinstance(inner, _AFTER) or (isinstance(inner, WaitEvent) and inner.stream == op.stream):
                return f"after its kernels an op records, syncs or makes other streams wait, not {inner!r}"
        return ""

    def to_python(self, check: str = "compare(schedule)") -> str:
        """A runnable snippet that rebuilds this schedule and prints ``check``
        on it (by default: the model against the oracle)."""
        steps = "".join(f"        {step!r},\n" for step in self.steps)
        return (
            "from npu_lifetime.schedules import *\n\n"
            f"schedule = Schedule(streams={self.streams}, events={self.events}, steps=(\n"
            f"{steps}    ), devices={self.devices})\n"
            f"print({check})\n"
        )
