"""A simulated device that runs a schedule in one of the orders its
dependencies allow, over a memory of tagged cells.

Each stream is a FIFO queue; a wait blocks its queue until the awaited event
record has run.  The host issues the steps in order without running the
device: a host synchronisation instead gates what its thread issues later
(each later operation of that thread waits for what the synchronisation
waited for), as a blocked host thread would, and ``Spawn``/``Join`` pass a
thread's gates on.  A synchronisation on one thread therefore orders
nothing another thread issues.  Once every step is issued the device runs,
a ``policy`` picking which ready queue runs next, so a test can try random
orders or an adversarial one.

At every free the executor does what a caching allocator may do: it hands
the block to a new owner as soon as the allocation stream has reached the
free and the events the allocator holds for the block have fired
(record_use events, and record_stream events recorded at the free).  That
reuse is a *reuse write* of poison into the block's cells, run on a lane of
its own so that it orders nothing else.  An access of a storage that runs
after its reuse write is a corruption: it reads the new owner's data or
clobbers it.  An access that finds another storage's tag in its cells has
observed foreign data.

Memory is a set of cells: a storage covers ``[address, address + size)``.

With ``allocator_waits`` an allocation over reused cells also waits for the
previous owners' reuse writes, as an allocator that makes the allocating
stream wait on the held events does.  That wait orders the new owner's
stream after streams the program never synchronised with, so the check that
an uncovered free can corrupt runs without it: a sanitizer must not credit
a program with ordering the allocator happened to add for another block.
"""
from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Optional

from .schedule import (
    Adopt, Alloc, DeleteEvent, EraseStream, Free, Join, Op, QueryEvent, Read, RecordEvent, RecordStream,
    RecordUse, Schedule, Spawn, Switch, SyncDevice, SyncEvent, SyncStream, View, WaitEvent, WaitStream, Write,
)

Policy = Callable[[list], int]  # ready queues (sorted) -> the one to run
# Queues 0 .. streams-1 are the streams; higher ones are reuse lanes.


def delay_stream(victim: int) -> Policy:
    """Adversarial: run stream ``victim`` only when nothing else can run."""

    def pick(ready: list) -> int:
        others = [s for s in ready if s != victim]
        return others[0] if others else victim

    return pick


def random_order(seed: int) -> Policy:
    rng = random.Random(seed)
    return lambda ready: rng.choice(ready)


@dataclass
class _Op:
    kind: str  # alloc | access | record | wait | reuse
    step: int = -1
    storage: int = -1
    cells: range = range(0)
    is_write: bool = False
    token: Optional[int] = None


@dataclass
class _Block:
    storage: int
    stream: int
    cells: range
    recorded: dict = field(default_factory=dict)
    use_tokens: list = field(default_factory=list)
    freed: bool = False


@dataclass
class Execution:
    """What one run observed.  ``corrupted`` maps each storage accessed after
    its reuse write to the steps of those accesses; ``foreign`` lists
    ``(step, tag found)`` for accesses that found another owner's tag."""

    corrupted: dict = field(default_factory=dict)
    foreign: list = field(default_factory=list)


class _Device:
    def __init__(self, schedule: Schedule, policy: Policy) -> None:
        self.queues = [deque() for _ in range(schedule.streams)]
        self.policy = policy
        self.reuse_token: dict = {}  # cell -> token of its last reuse write
        self.done_tokens: set = set()
        self.next_token = 0
        self.event_token: dict = {}
        self.memory: dict = {}
        self.reused: set = set()
        self.result = Execution()

    def token(self) -> int:
        self.next_token += 1
        return self.next_token

    def ready(self, stream: int) -> bool:
        q = self.queues[stream]
        return bool(q) and (q[0].kind != "wait" or q[0].token is None or q[0].token in self.done_tokens)

    def run_one(self) -> None:
        ready = [s for s in range(len(self.queues)) if self.ready(s)]
        if not ready:
            raise RuntimeError("simulated device deadlocked")  # issue order forbids it
        self.execute(self.queues[self.policy(ready)].popleft())

    def run_until(self, done: Callable[[], bool]) -> None:
        while not done():
            self.run_one()

    def execute(self, op: _Op) -> None:
        if op.kind == "record":
            self.done_tokens.add(op.token)
        elif op.kind == "alloc":
            for cell in op.cells:
                self.memory[cell] = op.storage
        elif op.kind == "reuse":
            for cell in op.cells:
                self.memory[cell] = ("reused", op.storage)
            self.reused.add(op.storage)
            self.done_tokens.add(op.token)
        elif op.kind == "access":
            self.access(op)

    def access(self, op: _Op) -> None:
        if op.storage in self.reused:
            self.result.corrupted.setdefault(op.storage, []).append(op.step)
        for cell in op.cells:
            found = self.memory.get(cell)
            if found != op.storage:
                self.result.foreign.append((op.step, found))
                break
        if op.is_write:
            for cell in op.cells:
                self.memory[cell] = op.storage


class _Host:
    """Issues the schedule's steps to the device in order, from its threads."""

    def __init__(self, schedule: Schedule, device: _Device, allocator_waits: bool) -> None:
        self.schedule = schedule
        self.d = device
        self.blocks: dict = {}
        self.allocator_waits = allocator_waits
        self.gates: dict = {0: set()}  # running thread -> tokens its host waits waited for
        self.thread = 0
        self.waited = [set() for _ in range(schedule.streams)]  # tokens each stream waited for

    # -- queueing, behind the issuing thread's host waits ------------------------
    def put(self, stream: int, op: _Op) -> None:
        queue, waited = self.d.queues[stream], self.waited[stream]
        for token in sorted(self.gates[self.thread] - waited):
            queue.append(_Op("wait", token=token))
            waited.add(token)
        queue.append(op)

    def record(self, stream: int) -> int:
        token = self.d.token()
        self.put(stream, _Op("record", token=token))
        return token

    def wait(self, stream: int, token: Optional[int]) -> None:
        self.put(stream, _Op("wait", token=token))

    def reached(self, stream: int) -> int:
        """A token that fires once what is queued on ``stream`` now has run:
        for a host wait, which queues nothing (so not behind its gates)."""
        token = self.d.token()
        self.d.queues[stream].append(_Op("record", token=token))
        return token

    def host_waits(self, *tokens: Optional[int]) -> None:
        self.gates[self.thread].update(t for t in tokens if t is not None)

    def step(self, i: int, s) -> None:
        d = self.d
        match s:
            case Alloc():
                cells = range(s.address, s.address + s.size)
                self.blocks[s.tensor] = _Block(i, s.stream, cells)
                if self.allocator_waits:
                    for token in {d.reuse_token[c] for c in cells if c in d.reuse_token}:
                        self.wait(s.stream, token)
                self.put(s.stream, _Op("alloc", i, i, cells))
            case Adopt():
                cells = range(s.address, s.address + s.size)
                self.blocks[s.tensor] = _Block(i, s.stream, cells)
                for cell in cells:  # its data was there before the schedule began
                    d.memory[cell] = i
            case View():
                self.blocks[s.tensor] = self.blocks[s.base]
            case Read() | Write():
                self.access(i, s.tensor, s.stream, isinstance(s, Write))
            case Op():
                for event in s.before:
                    self.step(i, event)
                tensors = (*s.reads, *s.writes)
                for block in dict.fromkeys(self.blocks[t].storage for t in tensors):
                    written = any(self.blocks[t].storage == block for t in s.writes)
                    tensor = next(t for t in tensors if self.blocks[t].storage == block)
                    self.access(i, tensor, s.stream, written)
                for event in s.after:
                    self.step(i, event)
            case DeleteEvent():
                d.event_token.pop(s.event, None)
            case RecordStream() | EraseStream():
                self.blocks[s.tensor].recorded[s.stream] = isinstance(s, RecordStream)
            case RecordUse():
                b = self.blocks[s.tensor]
                if not b.freed and s.stream != b.stream:  # on its own stream the allocator records nothing
                    b.use_tokens.append(self.record(s.stream))
            case Free():
                self.free(self.blocks[s.tensor])
            case RecordEvent():
                d.event_token[s.event] = self.record(s.stream)
            case WaitEvent():
                self.wait(s.stream, d.event_token.get(s.event))
            case WaitStream():
                self.wait(s.waiter, self.record(s.waitee))
            case SyncEvent() | QueryEvent():
                self.host_waits(d.event_token.get(s.event))
            case SyncStream():
                self.host_waits(self.reached(s.stream))
            case SyncDevice():
                self.host_waits(*(
                    self.reached(k) for k in range(self.schedule.streams)
                    if s.device is None or self.schedule.device_of(k) == s.device
                ))
            case Spawn():
                self.gates[s.thread] = set(self.gates[self.thread])
            case Switch():
                self.thread = s.thread
            case Join():
                self.host_waits(*self.gates.pop(s.thread))

    def access(self, i: int, tensor: int, stream: int, is_write: bool) -> None:
        b = self.blocks[tensor]
        if not b.freed:
            self.put(stream, _Op("access", i, b.storage, b.cells, is_write))

    def free(self, b: _Block) -> None:
        if b.freed:
            return
        b.freed = True
        d = self.d
        # A free queues nothing on a stream: the allocator notes where each
        # stream has reached (its allocation stream, record_stream's streams)
        # and hands the block on once those points have run and the freeing
        # thread's host waits are over (a new owner comes later still).  Queued
        # as a record behind this thread's gates, the mark would also have
        # ordered later work of other threads on that stream after this
        # thread's host waits, work the program never ordered.
        marks = [self.reached(b.stream)]
        marks += [self.reached(r) for r, on in b.recorded.items() if on and r != b.stream]
        held = [*marks, *sorted(self.gates[self.thread]), *b.use_tokens]
        reuse = _Op("reuse", storage=b.storage, cells=b.cells, token=d.token())
        d.queues.append(deque([*(_Op("wait", token=t) for t in held), reuse]))
        for cell in b.cells:
            d.reuse_token[cell] = reuse.token


def execute(schedule: Schedule, policy: Policy, allocator_waits: bool = True) -> Execution:
    """Issues ``schedule`` to a simulated device, then runs it to completion,
    choosing the next queue to run with ``policy``."""
    device = _Device(schedule, policy)
    host = _Host(schedule, device, allocator_waits)
    for i, step in enumerate(schedule.steps):
        host.step(i, step)
    device.run_until(lambda: not any(device.queues))
    return device.result
