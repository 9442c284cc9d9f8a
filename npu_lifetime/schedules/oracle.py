"""An independent oracle for the lifetime model.

It shares no code or representation with ``npu_lifetime.lifetime``: it builds
the explicit happens-before graph of a schedule (one node per device
operation or host synchronisation, edges for stream order, event waits and
host waits), keeps every access of every storage, and answers each question
by reachability in that graph, scanning the full history instead of the
model's compressed per-stream state.  An ``Op``'s accesses are placed where
the step says the device runs them (after its ``before`` events, before its
``after`` events), not inferred.

Reuse races: when a storage is freed, the uses no release point reaches stay
with it; a storage allocated later over an overlapping range checks each of
its accesses against all of them, directly in the graph.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from . import keys
from .schedule import (
    Adopt, Alloc, DeleteEvent, EraseStream, Free, Op, QueryEvent, Read, RecordEvent, RecordStream,
    RecordUse, Schedule, SyncDevice, SyncEvent, SyncStream, View, WaitEvent, WaitStream, Write,
)


class _Graph:
    """A DAG whose nodes are added in a topological order (the host's issue
    order), each with the set of its ancestors as a bitmask.  Node ``None``
    stands for "before tracking began": it reaches everything."""

    def __init__(self) -> None:
        self._ancestors: list = []

    def node(self, *preds: Optional[int]) -> int:
        mask = 0
        for p in preds:
            if p is not None:
                mask |= self._ancestors[p] | (1 << p)
        self._ancestors.append(mask)
        return len(self._ancestors) - 1

    def reaches(self, a: Optional[int], b: int) -> bool:
        return a is None or a == b or bool((self._ancestors[b] >> a) & 1)


@dataclass
class _Use:
    step: int
    stream: int
    node: Optional[int]
    is_write: bool


@dataclass
class _Storage:
    alloc_step: int
    stream: int
    address: int
    size: int
    history: list
    record_log: list = field(default_factory=list)  # (stream, recorded?) in order
    record_use_nodes: list = field(default_factory=list)
    freed: bool = False
    outstanding: list = field(default_factory=list)  # uses its free left uncovered
    previous: list = field(default_factory=list)  # earlier owners of overlapping memory
    raced: set = field(default_factory=set)  # (previous owner, stream) reported


class _Oracle:
    def __init__(self, schedule: Schedule) -> None:
        self.schedule = schedule
        self.g = _Graph()
        self.last: dict = {s: None for s in range(schedule.streams)}
        self.host: Optional[int] = None
        self.event_node: dict = {e: None for e in range(schedule.events)}
        self.storage_of: dict = {}
        self.freed: list = []  # freed storages, in free order
        self.found: list = []

    def op(self, stream: int, *extra: Optional[int]) -> int:
        """A device operation queued on ``stream`` by the host, now."""
        n = self.g.node(self.last[stream], self.host, *extra)
        self.last[stream] = n
        return n

    def host_waits(self, *nodes: Optional[int]) -> None:
        self.host = self.g.node(self.host, *nodes)

    def step(self, i: int, s) -> None:
        match s:
            case Alloc():
                node = self.op(s.stream)
                st = _Storage(i, s.stream, s.address, s.size, [_Use(i, s.stream, node, True)])
                st.previous = [p for p in self.freed if _overlap(p, st)]
                self.storage_of[s.tensor] = st
            case Adopt():
                self.storage_of[s.tensor] = _Storage(i, s.stream, s.address, s.size, [_Use(i, s.stream, None, True)])
            case View():
                self.storage_of[s.tensor] = self.storage_of[s.base]
            case Read() | Write():
                self.access(i, s.tensor, s.stream, isinstance(s, Write))
            case Op():
                self.run_op(i, s)
            case Free():
                self.free(i, s.tensor)
            case RecordStream() | EraseStream():
                st = self.live(i, s.tensor)
                if st:
                    st.record_log.append((s.stream, isinstance(s, RecordStream)))
            case RecordUse():
                st = self.live(i, s.tensor)
                if st:
                    st.record_use_nodes.append(self.op(s.stream))
            case RecordEvent():
                self.event_node[s.event] = self.op(s.stream)
            case DeleteEvent():
                self.event_node[s.event] = None
            case WaitEvent():
                self.op(s.stream, self.recorded(i, s.event))
            case SyncEvent() | QueryEvent():
                self.host_waits(self.recorded(i, s.event))
            case WaitStream():
                self.op(s.waiter, self.last[s.waitee])
            case SyncStream():
                self.host_waits(self.last[s.stream])
            case SyncDevice():
                self.host_waits(*(
                    n for stream, n in self.last.items()
                    if s.device is None or self.schedule.device_of(stream) == s.device
                ))

    def run_op(self, i: int, op: Op) -> None:
        """The op's ``before`` events, its kernels' accesses, its ``after`` events."""
        for event in op.before:
            self.step(i, event)
        tensors = list(op.reads) + list(op.writes)
        storages: list = []
        for t in tensors:
            st = self.storage_of[t]
            if all(st is not other for other in storages):
                storages.append(st)
        for st in storages:
            if st.freed:
                self.found.append(keys.use_after_free(i, st.alloc_step))
                continue
            written = any(self.storage_of[t] is st for t in op.writes)
            self.access_storage(i, st, op.stream, written)
        for event in op.after:
            self.step(i, event)

    def recorded(self, i: int, event: int) -> Optional[int]:
        node = self.event_node[event]
        if node is None:
            self.found.append(keys.unrecorded_event_wait(i))
        return node

    def live(self, i: int, tensor: int) -> Optional[_Storage]:
        st = self.storage_of[tensor]
        if st.freed:
            self.found.append(keys.use_after_free(i, st.alloc_step))
            return None
        return st

    def access(self, i: int, tensor: int, stream: int, is_write: bool) -> None:
        st = self.live(i, tensor)
        if st is not None:
            self.access_storage(i, st, stream, is_write)

    def access_storage(self, i: int, st: _Storage, stream: int, is_write: bool) -> None:
        node = self.op(stream)
        last_write = max(k for k, u in enumerate(st.history) if u.is_write)
        prior = st.history[last_write]
        if not self.g.reaches(prior.node, node):
            self.found.append(keys.race(i, prior.step))
        if is_write:
            racing = [u for u in st.history[last_write + 1:] if not self.g.reaches(u.node, node)]
            for u in _latest_per_stream(racing):
                self.found.append(keys.race(i, u.step))
        st.history.append(_Use(i, stream, node, is_write))
        self.check_reuse(i, st, node, is_write)

    def check_reuse(self, i: int, st: _Storage, node: int, is_write: bool) -> None:
        """Each use an earlier owner's free left uncovered must reach this
        access when either of them writes."""
        for prev in st.previous:
            by_stream: dict = {}
            for u in prev.outstanding:
                if (u.is_write or is_write) and not self.g.reaches(u.node, node):
                    by_stream[u.stream] = u  # the latest such use per stream
            for stream, u in by_stream.items():
                if (prev.alloc_step, stream) not in st.raced:
                    st.raced.add((prev.alloc_step, stream))
                    self.found.append(keys.reuse_race(i, st.alloc_step, prev.alloc_step, stream, u.step))

    def free(self, i: Optional[int], tensor: int) -> None:
        st = self.storage_of[tensor]
        if st.freed:
            self.found.append(keys.invalid_free(i, "double"))
            return
        st.freed = i is not None
        release = [self.g.node(self.last[st.stream], self.host), *st.record_use_nodes]
        recorded = {}
        for stream, on in st.record_log:
            recorded[stream] = on
        release += [self.g.node(self.last[r], self.host) for r, on in recorded.items() if on]
        uncovered = [
            u for u in st.history if not any(self.g.reaches(u.node, r) for r in release)
        ]
        for u in _latest_per_stream(uncovered):
            self.found.append(keys.uncovered_free(i, st.alloc_step, u.stream, u.step))
        if st.freed:
            st.outstanding = uncovered
            self.freed.append(st)

    def flush(self) -> None:
        """Reports, for storages still alive, what a free now would leave."""
        seen = set()
        for tensor, st in self.storage_of.items():
            if not st.freed and id(st) not in seen:
                seen.add(id(st))
                self.free(None, tensor)


def _overlap(a: _Storage, b: _Storage) -> bool:
    return a.address < b.address + b.size and b.address < a.address + a.size


def _latest_per_stream(uses: list) -> list:
    latest: dict = {}
    for u in uses:
        latest[u.stream] = u
    return list(latest.values())


def run_oracle(schedule: Schedule) -> list:
    """The oracle's findings on ``schedule``, flushed at its end, as keys."""
    oracle = _Oracle(schedule)
    for i, step in enumerate(schedule.steps):
        oracle.step(i, step)
    oracle.flush()
    return keys.sort(oracle.found)
