"""Random multi-stream schedules: a builder that interprets raw bytes, and
hypothesis strategies over it.

``build_schedule(data, ...)`` reads four bytes per step (kind and three
arguments) and interprets them against the state built so far (live
tensors, memory cells, recorded events), skipping what does not apply.
Any byte string is a valid input, so generation is cheap (the fuzzer feeds
it ``random`` bytes) and shrinking is easy (hypothesis, or the fuzzer's own
shrinker, deletes steps and lowers bytes while the schedule stays valid).

Generated schedules are what a caching allocator could produce: memory is
16-cell blocks, an allocation takes a whole block, a half or a quarter of
one (a split block); freed cells are reused only by an allocation on the
stream that allocated them last, or on any stream of their device once that
device has been synchronised since (the memory went back to the driver).
They include storages that existed before tracking (``Adopt``), deleted
events, two devices with per-device syncs, ops that issue events of
their own (``Op``: barriers before the kernels, records and host syncs
after), and up to ``MAX_THREADS`` host threads (``Spawn``, ``Switch``,
``Join``; a deleted ``Spawn`` turns its thread's ``Switch``/``Join`` steps
into ones on the threads left, or drops them, so threads shrink away).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from hypothesis import strategies as st

from .schedule import (
    Adopt, Alloc, DeleteEvent, EraseStream, Free, Join, Op, QueryEvent, Read, RecordEvent, RecordStream,
    RecordUse, Schedule, Spawn, Switch, SyncDevice, SyncEvent, SyncStream, View, WaitEvent, WaitStream, Write,
)

# Each kind's weight is how often it appears in this list.  Byte value 0 is
# what shrinking moves towards, so the simplest step comes first.
KINDS = (
    "read", "write", "alloc", "free",
    "read", "write", "alloc", "free", "read", "write", "op", "op", "split_alloc",
    "view", "record_stream", "record_use", "erase_stream",
    "record_event", "wait_event", "wait_stream", "wait_stream",
    "sync_stream", "sync_event", "sync_device", "delete_event", "adopt",
    "spawn", "switch", "switch", "join",
)
BYTES_PER_STEP = 4
BLOCK_CELLS = 16
MAX_THREADS = 3  # host threads 0 .. MAX_THREADS-1
_PIECES = ((0, 16), (0, 8), (8, 8), (0, 4), (4, 4), (8, 4), (12, 4))  # (offset, cells)


@dataclass
class _Cell:
    owner: Optional[int] = None  # live root tensor
    last_stream: Optional[int] = None  # allocation stream of its last owner
    synced_since_free: bool = True
    used: bool = False  # ever allocated (an Adopt needs fresh memory)


@dataclass
class _Builder:
    streams: int
    events: int
    devices: int
    blocks: int
    misuse: bool
    steps: list = field(default_factory=list)
    live: list = field(default_factory=list)  # tensor names
    dead: list = field(default_factory=list)
    storage: dict = field(default_factory=dict)  # tensor -> root tensor
    cells_of: dict = field(default_factory=dict)  # root tensor -> range of cells
    recorded_events: set = field(default_factory=set)
    next_tensor: int = 0
    threads: list = field(default_factory=lambda: [0])  # running host threads
    thread: int = 0  # the one issuing

    def __post_init__(self) -> None:
        self.cells = [_Cell() for _ in range(self.blocks * BLOCK_CELLS)]
        self.occupied = [0] * self.blocks  # per block, a bit per owned cell
        self.on_device = [[s for s in range(self.streams) if s % self.devices == d] for d in range(self.devices)]

    def add(self, kind: str, a: int, b: int, c: int) -> None:
        getattr(self, "_" + kind)(a, b, c)

    # -- helpers --------------------------------------------------------------
    def _device_of(self, stream: int) -> int:
        return stream % self.devices

    def _block_device(self, block: int) -> int:
        return block % self.devices

    def _tensor(self, a: int) -> Optional[int]:
        """A tensor to act on; with none live, allocates one instead."""
        pool = self.live + self.dead if self.misuse else self.live
        if pool:
            return pool[a % len(pool)]
        self._alloc(a, a, 0)
        return None

    def _name(self) -> int:
        self.next_tensor += 1
        return self.next_tensor - 1

    def _placements(self, pieces, stream_hint: int) -> list:
        """(start cell, cells, stream) for every free placement of ``pieces``
        that the allocation rule allows, streams chosen from ``stream_hint``."""
        out = []
        for block in range(self.blocks):
            occupied = self.occupied[block]
            for offset, size in pieces:
                if occupied & (((1 << size) - 1) << offset):
                    continue
                start = block * BLOCK_CELLS + offset
                span = self.cells[start:start + size]
                bound = {c.last_stream for c in span if c.last_stream is not None and not c.synced_since_free}
                if len(bound) > 1:
                    continue
                if bound:
                    stream = bound.pop()
                else:
                    on_device = self.on_device[self._block_device(block)]
                    if not on_device:
                        continue
                    stream = on_device[stream_hint % len(on_device)]
                out.append((start, size, stream))
        return out

    def _place(self, start: int, size: int, stream: int, step_class) -> None:
        t = self._name()
        self.steps.append(step_class(t, stream, start, size))
        self.live.append(t)
        self.storage[t] = t
        self.cells_of[t] = range(start, start + size)
        self.occupied[start // BLOCK_CELLS] |= ((1 << size) - 1) << (start % BLOCK_CELLS)
        for cell in self.cells_of[t]:
            c = self.cells[cell]
            c.owner, c.last_stream, c.used = t, stream, True

    # -- steps ----------------------------------------------------------------
    def _alloc(self, a: int, b: int, c: int) -> None:
        self._allocate(self._placements(_PIECES[:1], a), b, c)

    def _split_alloc(self, a: int, b: int, c: int) -> None:
        self._allocate(self._placements(_PIECES[1:], a), b, c)

    def _allocate(self, options: list, b: int, c: int) -> None:
        # half the time, memory freed before (where reuse races live), if any
        reused = [o for o in options if any(cell.used for cell in self.cells[o[0]:o[0] + o[1]])]
        if reused and c % 2:
            options = reused
        if options:
            self._place(*options[b % len(options)], Alloc)

    def _adopt(self, a: int, b: int, c: int) -> None:
        options = [
            (start, size, stream) for start, size, stream in self._placements(_PIECES[:1], a)
            if not any(cell.used for cell in self.cells[start:start + size])
        ]
        if options:
            self._place(*options[b % len(options)], Adopt)

    def _view(self, a: int, b: int, c: int) -> None:
        if self.live:
            base = self.live[a % len(self.live)]
            t = self._name()
            self.steps.append(View(t, base))
            self.live.append(t)
            self.storage[t] = self.storage[base]

    def _free(self, a: int, b: int, c: int) -> None:
        t = self._tensor(a)
        if t is None:
            return
        self.steps.append(Free(t))
        root = self.storage[t]
        if root in self.cells_of:
            cells = self.cells_of.pop(root)
            self.occupied[cells.start // BLOCK_CELLS] &= ~(((1 << len(cells)) - 1) << (cells.start % BLOCK_CELLS))
            for cell in cells:
                self.cells[cell].owner = None
                self.cells[cell].synced_since_free = False
        gone = [x for x in self.live if self.storage[x] == root]
        self.live = [x for x in self.live if self.storage[x] != root]
        self.dead += gone

    def _on_tensor(self, cls, a: int, b: int) -> None:
        t = self._tensor(a)
        if t is not None:
            self.steps.append(cls(t, b % self.streams))

    def _read(self, a, b, c): self._on_tensor(Read, a, b)
    def _write(self, a, b, c): self._on_tensor(Write, a, b)
    def _record_stream(self, a, b, c): self._on_tensor(RecordStream, a, b)
    def _erase_stream(self, a, b, c): self._on_tensor(EraseStream, a, b)
    def _record_use(self, a, b, c): self._on_tensor(RecordUse, a, b)

    def _record_event(self, a: int, b: int, c: int) -> None:
        if self.events:
            self.steps.append(self._record(a % self.events, b % self.streams))

    def _record(self, event: int, stream: int) -> RecordEvent:
        self.recorded_events.add(event)
        return RecordEvent(event, stream)

    def _event(self, a: int) -> Optional[int]:
        # Waiting on a never-recorded event is misuse; keep it out otherwise.
        pool = range(self.events) if self.misuse else sorted(self.recorded_events)
        return pool[a % len(pool)] if len(pool) else None

    def _wait_event(self, a: int, b: int, c: int) -> None:
        e = self._event(a)
        if e is not None:
            self.steps.append(WaitEvent(b % self.streams, e))

    def _sync_event(self, a: int, b: int, c: int) -> None:
        e = self._event(a)
        if e is not None:
            self.steps.append(SyncEvent(e) if b % 2 else QueryEvent(e))

    def _delete_event(self, a: int, b: int, c: int) -> None:
        if self.events:
            self.steps.append(DeleteEvent(a % self.events))
            self.recorded_events.discard(a % self.events)

    def _wait_stream(self, a: int, b: int, c: int) -> None:
        waiter, waitee = a % self.streams, b % self.streams
        if waiter != waitee:
            self.steps.append(WaitStream(waiter, waitee))

    def _sync_stream(self, a: int, b: int, c: int) -> None:
        self.steps.append(SyncStream(a % self.streams))

    def _sync_device(self, a: int, b: int, c: int) -> None:
        device = None if self.devices == 1 or b % 3 == 0 else a % self.devices
        self.steps.append(SyncDevice(device))
        for cell_index, cell in enumerate(self.cells):
            if device is None or self._block_device(cell_index // BLOCK_CELLS) == device:
                cell.synced_since_free = True

    def _op(self, a: int, b: int, c: int) -> None:
        """An op on a stream that reads a tensor and writes another (or
        itself), with in-op events before and after its kernels."""
        t = self._tensor(a)
        if t is None:
            return
        stream = b % self.streams
        pool = self.live + self.dead if self.misuse else self.live
        other = pool[(a >> 3) % len(pool)]
        shape = (b >> 2) % 4  # read t, write other / read t / write t / read and write t
        reads = () if shape == 2 else (t,)
        writes = ((other,), (), (t,), (t,))[shape]
        before, after = self._op_events(stream, c)
        self.steps.append(Op(stream, reads, writes, before, after))

    def _op_events(self, stream: int, c: int) -> tuple:
        """In-op events like a real op's: none; a barrier on another stream
        (cross-device copy, collective launch); a host read-back (``item``);
        a completion record waited on by another stream."""
        other = (stream + 1 + (c >> 5) % max(1, self.streams - 1)) % self.streams
        e = (c >> 3) % self.events if self.events else None
        before: tuple = ()
        after: tuple = ()
        pick = c % 8
        if e is not None and other != stream and pick in (1, 2):
            before = (self._record(e, other), WaitEvent(stream, e))
        if pick in (2, 3) and e is not None:
            after = (self._record(e, stream),) + ((WaitEvent(other, e),) if other != stream else ())
        elif pick == 4:
            after = (SyncStream(stream),)
        elif pick == 5:
            after = (SyncDevice(self._device_of(stream) if self.devices > 1 else None),)
            self._sync_device_cells(self._device_of(stream) if self.devices > 1 else None)
        elif pick == 6 and e is not None:
            after = (self._record(e, stream), SyncEvent(e))
        return before, after

    # -- host threads ---------------------------------------------------------------
    def _spawn(self, a: int, b: int, c: int) -> None:
        """Starts a thread; half the time it issues what follows."""
        idle = [t for t in range(1, MAX_THREADS) if t not in self.threads]
        if idle:
            t = idle[a % len(idle)]
            self.steps.append(Spawn(t))
            self.threads.append(t)
            if b % 2:
                self._switch_to(t)

    def _switch(self, a: int, b: int, c: int) -> None:
        others = [t for t in self.threads if t != self.thread]
        if others:
            self._switch_to(others[a % len(others)])

    def _switch_to(self, thread: int) -> None:
        self.steps.append(Switch(thread))
        self.thread = thread

    def _join(self, a: int, b: int, c: int) -> None:
        """The current thread joins another (the main thread joins the current one)."""
        joinable = self.threads[1:]
        if joinable:
            t = joinable[a % len(joinable)]
            if t == self.thread:
                self._switch_to(0)
            self.steps.append(Join(t))
            self.threads.remove(t)

    def _sync_device_cells(self, device: Optional[int]) -> None:
        for cell_index, cell in enumerate(self.cells):
            if device is None or self._block_device(cell_index // BLOCK_CELLS) == device:
                cell.synced_since_free = True


def build_schedule(
    data: bytes, streams: int, events: int, devices: int = 1, blocks: int = 3, misuse: bool = False
) -> Schedule:
    """Interprets ``data`` (four bytes a step) as a valid schedule."""
    builder = _Builder(streams, events, devices, blocks, misuse)
    usable = len(data) - len(data) % BYTES_PER_STEP
    for i in range(0, usable, BYTES_PER_STEP):
        kind, a, b, c = data[i:i + BYTES_PER_STEP]
        builder.add(KINDS[kind % len(KINDS)], a, b, c)
    steps = builder.steps[:usable // BYTES_PER_STEP]  # at most a step per four bytes (a spawn may add a switch)
    return Schedule(streams, events, tuple(steps), devices)


def raw_steps(max_steps: int = 30, min_steps: int = 0):
    """The strategy for the bytes ``build_schedule`` interprets: a list of
    steps of four bytes each, joined.  Each step is an element hypothesis can
    delete on its own while shrinking, so a failing schedule shrinks to the
    few steps it needs (a length drawn first, then that many bytes, could
    only shrink by regenerating: reproducers kept dozens of steps)."""
    step = st.binary(min_size=BYTES_PER_STEP, max_size=BYTES_PER_STEP)
    return st.lists(step, min_size=min_steps, max_size=max_steps).map(b"".join)


def schedules(max_streams: int = 3, max_events: int = 2, max_steps: int = 30, blocks: int = 3,
              misuse: bool = False, max_devices: int = 2):
    """The strategy for random valid schedules of at most ``max_steps`` steps
    over 1 to ``max_streams`` streams on 1 to ``max_devices`` devices, 0 to
    ``max_events`` events and ``blocks`` blocks of reusable memory.  With
    ``misuse``, they may also free a storage twice, use a freed one, or wait
    on an event never recorded.  Bad arguments are refused here, naming the
    argument, not when the first example is drawn."""
    for name, value, least in (("max_streams", max_streams, 1), ("max_events", max_events, 0),
                               ("max_steps", max_steps, 0), ("blocks", blocks, 1),
                               ("max_devices", max_devices, 1)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"schedules(): {name} must be an int >= {least}, not {type(value).__name__} {value!r}")
        if value < least:
            raise ValueError(f"schedules(): {name} must be an int >= {least}, not {value}")
    if not isinstance(misuse, bool):
        raise TypeError(f"schedules(): misuse must be True or False, not {type(misuse).__name__} {misuse!r}")
    return _schedules(max_streams, max_events, max_steps, blocks, misuse, max_devices)


@st.composite
def _schedules(draw, max_streams: int, max_events: int, max_steps: int, blocks: int, misuse: bool,
               max_devices: int) -> Schedule:
    streams = draw(st.integers(1, max_streams))
    events = draw(st.integers(0, max_events))
    devices = draw(st.integers(1, max(1, min(max_devices, streams))))
    data = draw(raw_steps(max_steps))
    return build_schedule(data, streams, events, devices, blocks, misuse)


def random_schedule(rng, max_streams: int, max_events: int, max_steps: int,
                    blocks: int = 3, misuse: bool = False, max_devices: int = 2) -> tuple:
    """One schedule from ``random.Random`` ``rng`` without hypothesis (the
    fuzzer's fast path); returns ``(schedule, config, data)`` so the same
    schedule can be rebuilt (and shrunk) from its bytes."""
    streams = rng.randint(1, max_streams)
    events = rng.randint(0, max_events)
    devices = rng.randint(1, max(1, min(max_devices, streams)))
    length = max(rng.randint(1, max_steps), rng.randint(1, max_steps))  # long ones more often
    data = rng.randbytes(length * BYTES_PER_STEP)
    config = (streams, events, devices, blocks, misuse)
    return build_schedule(data, *config), config, data
