"""Hypothesis strategies for random multi-stream schedules.

``schedules()`` draws a list of small integer triples and interprets each as
one step against the state built so far (live tensors, free addresses,
recorded events), skipping triples that do not apply.  Drawing plain
integers keeps generation fast, and lets hypothesis shrink a failing
schedule by deleting steps and lowering numbers while it stays valid.

Generated schedules are what a caching allocator could produce: a freed
address is reused only by an allocation on the stream that freed it, or on
any stream once the device has been synchronised since (the block went back
to the driver).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from hypothesis import strategies as st

from .schedule import (
    Alloc, EraseStream, Free, QueryEvent, Read, RecordEvent, RecordStream, RecordUse,
    Schedule, SyncDevice, SyncEvent, SyncStream, View, WaitEvent, WaitStream, Write,
)

# Each kind's weight is how often it appears in this list.  Index 0 is what
# shrinking moves towards, so the simplest step comes first.
_KINDS = (
    "read", "write", "alloc", "free",
    "read", "write", "alloc", "free", "read", "write",
    "view", "record_stream", "record_use", "erase_stream",
    "record_event", "wait_event", "wait_stream", "wait_stream",
    "sync_stream", "sync_event", "query_event", "sync_device",
)
_SLOT_BYTES = 0x1000


@dataclass
class _Slot:
    last_stream: Optional[int] = None
    synced_since_free: bool = True


@dataclass
class _Builder:
    streams: int
    events: int
    slots: int
    misuse: bool
    steps: list = field(default_factory=list)
    live: list = field(default_factory=list)      # tensor names
    dead: list = field(default_factory=list)
    storage: dict = field(default_factory=dict)   # tensor -> root tensor
    slot_of: dict = field(default_factory=dict)   # root tensor -> slot
    recorded_events: set = field(default_factory=set)
    next_tensor: int = 0

    def __post_init__(self) -> None:
        self.slot_state = [_Slot() for _ in range(self.slots)]

    def add(self, kind: str, a: int, b: int) -> None:
        getattr(self, "_" + kind)(a, b)

    def _tensor(self, a: int) -> Optional[int]:
        """A tensor to act on; with none live, allocates one instead."""
        pool = self.live + self.dead if self.misuse else self.live
        if pool:
            return pool[a % len(pool)]
        self._alloc(a, a)
        return None

    def _name(self) -> int:
        self.next_tensor += 1
        return self.next_tensor - 1

    def _alloc(self, a: int, b: int) -> None:
        busy = set(self.slot_of.values())
        free = [s for s in range(self.slots) if s not in busy]
        if not free:
            return
        slot = free[b % len(free)]
        state = self.slot_state[slot]
        stream = a % self.streams
        if state.last_stream is not None and not state.synced_since_free:
            stream = state.last_stream
        t = self._name()
        self.steps.append(Alloc(t, stream, (slot + 1) * _SLOT_BYTES, _SLOT_BYTES))
        self.live.append(t)
        self.storage[t] = t
        self.slot_of[t] = slot
        state.last_stream = stream

    def _view(self, a: int, b: int) -> None:
        if self.live:
            base = self.live[a % len(self.live)]
            t = self._name()
            self.steps.append(View(t, base))
            self.live.append(t)
            self.storage[t] = self.storage[base]

    def _free(self, a: int, b: int) -> None:
        t = self._tensor(a)
        if t is None:
            return
        self.steps.append(Free(t))
        root = self.storage[t]
        if root in self.slot_of:
            self.slot_state[self.slot_of.pop(root)].synced_since_free = False
        gone = [x for x in self.live if self.storage[x] == root]
        self.live = [x for x in self.live if self.storage[x] != root]
        self.dead += gone

    def _on_tensor(self, cls, a: int, b: int) -> None:
        t = self._tensor(a)
        if t is not None:
            self.steps.append(cls(t, b % self.streams))

    def _read(self, a, b): self._on_tensor(Read, a, b)
    def _write(self, a, b): self._on_tensor(Write, a, b)
    def _record_stream(self, a, b): self._on_tensor(RecordStream, a, b)
    def _erase_stream(self, a, b): self._on_tensor(EraseStream, a, b)
    def _record_use(self, a, b): self._on_tensor(RecordUse, a, b)

    def _record_event(self, a: int, b: int) -> None:
        if self.events:
            self.steps.append(RecordEvent(a % self.events, b % self.streams))
            self.recorded_events.add(a % self.events)

    def _event(self, a: int) -> Optional[int]:
        # Waiting on a never-recorded event is misuse; keep it out otherwise.
        pool = range(self.events) if self.misuse else sorted(self.recorded_events)
        return pool[a % len(pool)] if len(pool) else None

    def _wait_event(self, a: int, b: int) -> None:
        e = self._event(a)
        if e is not None:
            self.steps.append(WaitEvent(b % self.streams, e))

    def _sync_event(self, a: int, b: int) -> None:
        e = self._event(a)
        if e is not None:
            self.steps.append(SyncEvent(e) if b % 2 else QueryEvent(e))

    _query_event = _sync_event

    def _wait_stream(self, a: int, b: int) -> None:
        waiter, waitee = a % self.streams, b % self.streams
        if waiter != waitee:
            self.steps.append(WaitStream(waiter, waitee))

    def _sync_stream(self, a: int, b: int) -> None:
        self.steps.append(SyncStream(a % self.streams))

    def _sync_device(self, a: int, b: int) -> None:
        self.steps.append(SyncDevice())
        for state in self.slot_state:
            state.synced_since_free = True


def build_schedule(
    raw, streams: int, events: int, slots: int = 3, misuse: bool = False
) -> Schedule:
    """Interprets ``(kind, a, b)`` integer triples as a valid schedule."""
    builder = _Builder(streams, events, slots, misuse)
    for kind, a, b in raw:
        builder.add(_KINDS[kind % len(_KINDS)], a, b)
    return Schedule(streams, events, tuple(builder.steps))


def raw_steps(max_steps: int = 30):
    """The strategy for the integer triples ``build_schedule`` interprets."""
    byte = st.integers(0, 255)
    return st.lists(st.tuples(st.integers(0, len(_KINDS) - 1), byte, byte), max_size=max_steps)


@st.composite
def schedules(
    draw,
    max_streams: int = 3,
    max_events: int = 2,
    max_steps: int = 30,
    slots: int = 3,
    misuse: bool = False,
) -> Schedule:
    """Random valid schedules of at most ``max_steps`` steps over 1 to
    ``max_streams`` streams, 0 to ``max_events`` events and ``slots``
    reusable addresses.  With ``misuse``, they may also free a storage twice,
    use a freed one, or wait on an event never recorded."""
    streams = draw(st.integers(1, max_streams))
    events = draw(st.integers(0, max_events))
    raw = draw(raw_steps(max_steps))
    return build_schedule(raw, streams, events, slots, misuse)
