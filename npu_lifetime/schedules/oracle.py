"""An independent oracle for the lifetime model.

It shares no code or representation with ``npu_lifetime.lifetime``: it builds
the explicit happens-before graph of a schedule (one node per device
operation or host synchronisation, edges for stream order, event waits and
host waits), keeps every access of every storage, and answers each question
by reachability in that graph, scanning the full history instead of the
model's compressed per-stream state.  An ``Op``'s accesses are placed where
the step says the device runs them (after its ``before`` events, before its
``after`` events), not inferred.

Host threads: each thread has its own last host node.  A device operation
a thread queues follows its stream's last node and its thread's; a host wait
adds a node after the thread's and what it waited for; ``Spawn`` starts the
child at its parent's node, ``Join`` adds a node after both threads'.  A free
is released from the freeing thread's node, so a wait on another thread
covers nothing.  What a thread queues carries its host waits along: the
event ``wait_stream`` records on the waitee, and ``record_use``'s event
(none on the allocation stream: the allocator records nothing there).

Data races, from the contract ("a cross-stream access not ordered after a
conflicting write, or a write not ordered after earlier reads"): an access
races with every earlier access of the storage, either of them a write,
that does not reach it; the allocation is a write.  Of those, it reports
each racing write that no later write follows (a racing write before
another adds nothing: that one races too) and, per stream, the latest
racing read that no later write follows.

A wait on an event never recorded (or deleted since) is a no-op, as on the
device: it orders nothing and is not a finding (the contract: README, "A
wait on an event never recorded is a no-op, as on the device, and not a
finding").

Reuse races: when a storage is freed, the uses no release point reaches stay
with it; a storage allocated later over an overlapping range checks each of
its accesses against all of them, directly in the graph.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from . import keys
from .schedule import (
    Adopt, Alloc, DeleteEvent, EraseStream, Free, Join, Op, QueryEvent, Read, RecordEvent, RecordStream,
    RecordUse, Schedule, Spawn, Switch, SyncDevice, SyncEvent, SyncStream, View, WaitEvent, WaitStream, Write,
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
        self.thread_node: dict = {0: None}  # running host thread -> its last node
        self.thread = 0  # the one issuing
        self.event_node: dict = {e: None for e in range(schedule.events)}
        self.storage_of: dict = {}
        self.freed: list = []  # freed storages, in free order
        self.found: list = []

    @property
    def host(self) -> Optional[int]:
        """The issuing thread's last node."""
        return self.thread_node[self.thread]

    def op(self, stream: int, *extra: Optional[int]) -> int:
        """A device operation queued on ``stream`` by the issuing thread, now."""
        n = self.g.node(self.last[stream], self.host, *extra)
        self.last[stream] = n
        return n

    def host_waits(self, *nodes: Optional[int]) -> None:
        self.thread_node[self.thread] = self.g.node(self.host, *nodes)

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
                if st and s.stream != st.stream:  # on its own stream the allocator records nothing
                    st.record_use_nodes.append(self.op(s.stream))
            case RecordEvent():
                self.event_node[s.event] = self.op(s.stream)
            case DeleteEvent():
                self.event_node[s.event] = None
            case WaitEvent():
                self.op(s.stream, self.recorded(i, s.event))
            case SyncEvent() | QueryEvent():
                self.host_waits(self.recorded(i, s.event))
            case WaitStream():  # an event recorded on the waitee, by this thread, then waited
                self.op(s.waiter, self.op(s.waitee))
            case SyncStream():
                self.host_waits(self.last[s.stream])
            case SyncDevice():
                self.host_waits(*(
                    n for stream, n in self.last.items()
                    if s.device is None or self.schedule.device_of(stream) == s.device
                ))
            case Spawn():
                self.thread_node[s.thread] = self.host
            case Switch():
                self.thread = s.thread
            case Join():
                self.host_waits(self.thread_node.pop(s.thread))

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
        """The event's record node; None (waits for nothing) if unrecorded."""
        return self.event_node[event]

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
        racing = self.racing(st.history, node, is_write)
        writes = [u for u in racing if u.is_write]
        reads = _latest_per_stream([u for u in racing if not u.is_write])
        for u in writes + reads:
            self.found.append(keys.race(i, u.step))
        st.history.append(_Use(i, stream, node, is_write))
        self.check_reuse(i, st, node, is_write)

    def racing(self, history: list, node: int, is_write: bool) -> list:
        """The earlier conflicting uses that do not reach ``node`` and that
        no later write follows (those others are before a racing write)."""
        out = []
        for k, u in enumerate(history):
            if (u.is_write or is_write) and not self.g.reaches(u.node, node):
                later_writes = (w for w in history[k + 1:] if w.is_write)
                if not any(self.g.reaches(u.node, w.node) for w in later_writes):
                    out.append(u)
        return out

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
