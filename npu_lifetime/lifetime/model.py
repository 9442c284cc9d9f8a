"""The lifetime model: happens-before between streams, the coverage rules
for frees, and reuse races.  This module is the single source of truth for
them; everything else (the torch front end, the schedule runner) only feeds
it events.

Happens-before is tracked with vector clocks.  Every stream ``S`` has a clock
``vc[S]`` mapping each stream to the latest of its operations that ``S`` is
ordered after; ``S``'s own entry counts its operations.  An event holds a copy
of its stream's clock at the record; waiting joins it in.  Each host thread
has a clock too: a host synchronisation joins into the clock of the thread
that waited, and every operation that thread queues afterwards is ordered
after it (joined lazily, once per host epoch).  ``set_host`` names the
thread issuing the next events; a thread started by another begins with its
clock (``fork_host``), and joining a thread takes in its clock
(``join_host``).  A wait on one thread covers nothing another thread frees.

An access at ``(U, c)`` happens before a point with clock ``P`` iff
``P[U] >= c``.

Data races.  An access races with every earlier access of the storage,
either of them a write, that does not happen before it (the allocation is a
write).  It is checked against the writes no later write is ordered after
(usually one, the last write; after a race between writes, each of them)
and, if it writes, against the latest read per stream that no write is
ordered after; every other earlier access is ordered before one of those,
so nothing racing is missed.  (Checking the last write only missed a read
ordered after the last write but not after an earlier write that write
raced with.)

A free of a block allocated on ``A`` is covered for a use
``(U, c)`` iff the use happens before one of the release points the
allocator waits for before handing the block out again:

* the free itself on ``A`` (``A``'s clock joined with the host's),
* each recorded stream ``R`` at the free (record_stream records there),
* each ``record_use`` call (an event on its stream at the call).

Since each test reads a single component, the release points fold into one
clock (their pointwise maximum) and only the last use per stream matters.

Reuse races.  The uses an uncovered free leaves behind (per stream: the last
use, and the last write) stay *outstanding* at the freed address range until
the host has synchronised past them.  A storage allocated over (part of) that
range is a new owner: each of its accesses must be ordered after every
outstanding use it conflicts with (a write after any use, a read after a
write); one that is not is a ``ReuseRace``, reported once per (new owner,
previous owner, usage stream).  The free is then *actual*; an uncovered free
no reuse raced with is *latent*, and its ``ReuseOutcome`` says why.
"""
from __future__ import annotations

import itertools
from bisect import bisect_left, bisect_right
from collections import OrderedDict, deque
from dataclasses import replace
from typing import Callable, Hashable, Iterable, Optional

from .findings import (
    Access,
    DataRace,
    Finding,
    InvalidFree,
    ReuseOutcome,
    ReuseRace,
    Site,
    Stream,
    UncoveredFree,
    UnrecordedEventWait,
    UseAfterFree,
)

Clock = dict  # stream -> int

# How many freed storage ids are remembered (by default) to tell a double
# free from a free of a pointer that was never allocated.
_FREED_MEMORY = 1 << 16
# How many outstanding uses of uncovered frees are tracked for reuse races;
# the oldest are forgotten beyond this (a bound on memory, not on correctness
# for any program that synchronises now and then).
_OUTSTANDING_CAP = 1 << 12


class ModelInputError(ValueError):
    """The event stream fed to the model is malformed (not a program bug):
    an unknown stream or event, or an allocation over a live storage."""


def _join(into: Clock, other: Clock) -> bool:
    changed = False
    for stream, tick in other.items():
        if into.get(stream, 0) < tick:
            into[stream] = tick
            changed = True
    return changed


class _Stream:
    __slots__ = ("device", "vc", "host_epoch")

    def __init__(self, stream: Stream, device: int) -> None:
        self.device = device
        self.vc: Clock = {stream: 0}
        self.host_epoch = -1


class _Storage:
    __slots__ = (
        "address", "size", "alloc_stream", "alloc_site",
        "last_write", "concurrent_writes", "reads", "last_use", "last_write_on", "recorded", "use_cover",
        "previous", "raced",
    )

    def __init__(self, address, size, alloc_stream, alloc_site, allocation: Access):
        self.address = address
        self.size = size
        self.alloc_stream = alloc_stream
        self.alloc_site = alloc_site
        # Data-race state: the last write, the earlier writes it is not ordered
        # after (by stream; None while the writes are ordered, as usual), and per
        # stream the latest read that no write is ordered after.
        self.last_write: Access = allocation
        self.concurrent_writes: Optional[dict] = None
        self.reads: dict = {}
        # Lifetime state: the latest use and write per stream, recorded
        # streams, and the pointwise maximum of the clocks of every record_use.
        self.last_use: dict = {}
        self.last_write_on: dict = {}
        self.recorded: Optional[set] = None  # made on first use: most storages never need them
        self.use_cover: Optional[Clock] = None
        # Reuse state: outstanding uses of earlier owners of this memory, and
        # those already reported as racing with this owner.
        self.previous: Optional[list] = None
        self.raced: Optional[set] = None


class _Outstanding:
    """A use that an uncovered free left behind on ``[address, end)``."""

    __slots__ = ("storage", "address", "end", "last_use", "last_write", "free", "retired")

    def __init__(self, storage, address, end, last_use, last_write, free: UncoveredFree):
        self.storage = storage
        self.address = address
        self.end = end
        self.last_use: Access = last_use
        self.last_write: Optional[Access] = last_write
        self.free = free
        self.retired = False

    @property
    def stream(self) -> Stream:
        return self.last_use.stream


class _OutstandingIndex:
    """Outstanding uses by address range, for overlap queries at allocation."""

    def __init__(self) -> None:
        self.starts: list = []
        self.records: list = []
        self.order: deque = deque()  # insertion order, for the cap
        self.max_size = 0

    def __bool__(self) -> bool:
        return bool(self.records)

    def add(self, rec: _Outstanding) -> Optional[_Outstanding]:
        """Adds ``rec``; returns the record forgotten to stay under the cap."""
        i = bisect_right(self.starts, rec.address)
        self.starts.insert(i, rec.address)
        self.records.insert(i, rec)
        self.order.append(rec)
        self.max_size = max(self.max_size, rec.end - rec.address)
        if len(self.records) > _OUTSTANDING_CAP:
            oldest = self.order.popleft()
            oldest.retired = True
            self._remove(oldest)
            return oldest
        return None

    def _remove(self, rec: _Outstanding) -> None:
        i = bisect_left(self.starts, rec.address)
        while self.records[i] is not rec:
            i += 1
        del self.starts[i]
        del self.records[i]

    def overlapping(self, start: int, end: int) -> list:
        found = []
        i = bisect_left(self.starts, end) - 1
        while i >= 0 and self.starts[i] + self.max_size > start:
            rec = self.records[i]
            if rec.end > start and not rec.retired:
                found.append(rec)
            i -= 1
        found.reverse()
        return found

    def retire(self, done: Callable[[_Outstanding], bool]) -> list:
        """Retires (and returns) the records ``done`` accepts."""
        retired = [rec for rec in self.records if done(rec)]
        for rec in retired:
            rec.retired = True
        if retired:
            self.prune()
        return retired

    def prune(self) -> None:
        kept = [(a, r) for a, r in zip(self.starts, self.records) if not r.retired]
        self.starts = [a for a, _ in kept]
        self.records = [r for _, r in kept]
        self.order = deque(r for r in self.order if not r.retired)
        self.max_size = max((r.end - r.address for r in self.records), default=0)


class LifetimeModel:
    """Feeds on stream, event, synchronisation and storage events; reports
    data races and reuse races at the access and uncovered frees at the free.

    ``access`` and ``free`` return their new findings.  With ``retain``, every
    finding is also appended to ``findings`` (see ``flush``); ``on_finding``,
    if given, is called with each once the event is fully processed.
    ``remember_frees`` bounds how many freed storages are remembered to name
    a double free or a use after free (0: none; such misuse is then reported
    as a free or use of an unknown storage).
    """

    def __init__(
        self,
        on_finding: Optional[Callable[[Finding], None]] = None,
        retain: bool = True,
        remember_frees: int = _FREED_MEMORY,
        host: Hashable = None,
    ) -> None:
        self._streams: dict = {}
        self._events: dict = {}  # event -> Clock of its last record, or None
        # host threads: the current one's clock and epoch are kept in _host / _host_epoch
        # (read on the hot path); epochs are unique across hosts, so a stream's host_epoch
        # says which version of which host's clock it has joined
        self._epochs = itertools.count(1)
        self._host_key: Hashable = host
        self._host: Clock = {}
        self._host_epoch = 0
        self._hosts: dict = {host: [self._host, 0]}  # host -> [clock, epoch]
        self._ended: set = set()  # hosts that issue nothing more (kept until joined)
        self._live: dict = {}
        self._by_address: dict = {}
        self._freed: OrderedDict = OrderedDict()  # storage -> free site
        self._remember_frees = remember_frees
        self._outstanding = _OutstandingIndex()
        self.findings: list = []
        self.retain = retain
        self.on_finding = on_finding

    # -- streams and events -------------------------------------------------
    def create_stream(self, stream: Stream, device: int = 0) -> None:
        if stream not in self._streams:
            self._streams[stream] = _Stream(stream, device)

    def has_stream(self, stream: Stream) -> bool:
        return stream in self._streams

    def create_event(self, event: Hashable) -> None:
        self._events.setdefault(event, None)

    def has_event(self, event: Hashable) -> bool:
        return event in self._events

    def event_recorded(self, event: Hashable) -> bool:
        return self._events.get(event) is not None

    def delete_event(self, event: Hashable) -> None:
        self._events.pop(event, None)

    def record_event(self, event: Hashable, stream: Stream) -> None:
        self._check_event(event)
        self._events[event] = dict(self._now(stream))

    def wait_event(self, stream: Stream, event: Hashable, site: Site = None) -> list:
        """``stream`` waits for ``event`` (cudaStreamWaitEvent)."""
        vc = self._now(stream)
        found: list = []
        recorded = self._recorded_clock(event, stream, site, found)
        if recorded is not None:
            _join(vc, recorded)
        return self._deliver(found)

    def wait_stream(self, waiter: Stream, waitee: Stream) -> None:
        """``waiter.wait_stream(waitee)``: an event on waitee, waited on by waiter."""
        _join(self._now(waiter), self._now(waitee))

    def synchronize_event(self, event: Hashable, site: Site = None) -> list:
        """The host waited for ``event`` (``synchronize()``, or ``query()``
        that returned True)."""
        found: list = []
        recorded = self._recorded_clock(event, None, site, found)
        if recorded is not None:
            self._host_join([recorded], site)
        return self._deliver(found)

    event_query_complete = synchronize_event

    def synchronize_stream(self, stream: Stream, site: Site = None) -> None:
        """The host waited for ``stream`` (``site``: where, for the reason a
        latent free gives; may be a zero-argument callable).  It queues
        nothing: the stream's clock must not take in this host's (another
        thread's later operations on the stream would look ordered after
        what this one waited for)."""
        self._host_join([self._stream(stream).vc], site)

    def synchronize_device(self, device: Optional[int] = None, site: Site = None) -> None:
        self._host_join(
            (s.vc for s in self._streams.values() if device is None or s.device == device), site
        )

    # -- host threads -----------------------------------------------------------
    def set_host(self, host: Hashable) -> None:
        """The host thread that issues the events that follow."""
        if host == self._host_key:
            return
        self._hosts[self._host_key][1] = self._host_epoch
        entry = self._hosts.get(host)
        if entry is None:
            entry = self._hosts[host] = [{}, next(self._epochs)]
        self._host_key = host
        self._host, self._host_epoch = entry

    def host_clock(self) -> Clock:
        """A copy of the current host thread's clock (what a thread it starts
        begins ordered after: pass it to ``fork_host``)."""
        return dict(self._host)

    def fork_host(self, child: Hashable, clock: Optional[Clock] = None) -> None:
        """``child`` starts ordered after ``clock`` (by default the current
        host's clock now): what its starter waited for before starting it."""
        clock = dict(self._host) if clock is None else dict(clock)
        if child == self._host_key:
            _join(self._host, clock)
            self._host_epoch = next(self._epochs)
        else:
            self._hosts[child] = [clock, next(self._epochs)]

    def join_host(self, child: Hashable) -> None:
        """The current host joined thread ``child``: it is ordered after
        everything ``child`` waited for; ``child`` is forgotten."""
        if child == self._host_key or child not in self._hosts:
            return
        clock, _ = self._hosts.pop(child)
        self._ended.discard(child)
        self._host_join([clock])

    def follow_hosts(self, hosts: Iterable[Hashable]) -> None:
        """The current host is ordered after everything ``hosts`` waited
        for (a worker thread that serves their requests)."""
        self._host_join([self._hosts[h][0] for h in hosts if h in self._hosts and h != self._host_key])

    def end_host(self, host: Hashable) -> None:
        """``host`` (a thread that ended) issues nothing more; its clock is
        kept for a later ``join_host``."""
        if host in self._hosts and host != self._host_key and host not in self._ended:
            self._ended.add(host)
            if self._outstanding.records:
                self._retire_completed()

    def forget_host(self, host: Hashable) -> None:
        """``host`` is gone for good (its id now names another thread)."""
        if host != self._host_key and self._hosts.pop(host, None) is not None:
            self._ended.discard(host)
            if self._outstanding.records:
                self._retire_completed()

    def hosts(self) -> tuple:
        return tuple(self._hosts)

    # -- storages -----------------------------------------------------------
    def allocate(
        self,
        storage: Hashable,
        stream: Stream,
        address: Optional[int] = None,
        size: int = 0,
        site: Site = None,
        preexisting: bool = False,
    ) -> None:
        """A new storage on ``stream``.  The allocation counts as a write on
        ``stream``: the block may still be in use by its previous owner's work
        queued there, so other streams must wait on ``stream`` before using it.
        A ``preexisting`` storage (allocated before tracking began) is taken
        as ordered before everything: its allocation races with nothing.
        A ``size`` of 0 means not known yet (see ``set_size``).
        """
        if storage in self._live:
            raise ModelInputError(f"storage {storage!r} allocated while live")
        if address is not None and address in self._by_address:
            raise ModelInputError(
                f"address {address:#x} allocated while storage "
                f"{self._by_address[address]!r} is live there"
            )
        if preexisting:
            self._stream(stream)
            allocation = Access(stream, 0, True, "<allocated before tracking>", site)
        else:
            allocation = self._tick(stream, True, "<allocation>", site, ())
        if self._freed:
            self._freed.pop(storage, None)
        s = self._live[storage] = _Storage(address, size, stream, site, allocation)
        if address is not None:
            self._by_address[address] = storage
            if size and not preexisting and self._outstanding.records:
                self._link_previous_owners(s)

    def set_size(self, storage: Hashable, size: int) -> None:
        """The size of a storage allocated with size 0 (known at first sight)."""
        s = self._live.get(storage)
        if s is not None and not s.size and size:
            s.size = size
            if s.address is not None:
                self._link_previous_owners(s)

    def storage_at(self, address: int) -> Optional[Hashable]:
        return self._by_address.get(address)

    def is_live(self, storage: Hashable) -> bool:
        return storage in self._live

    def access(
        self,
        storage: Hashable,
        stream: Stream,
        is_write: bool,
        op: Optional[str] = None,
        site: Site = None,
        args: tuple = (),
    ) -> list:
        """A read or write of ``storage`` queued on ``stream``; returns the
        data races and reuse races it makes."""
        s = self._live.get(storage)
        if s is None or stream not in self._streams:
            missing: list = []
            s = self._live_or_report(storage, stream, op or ("write" if is_write else "read"), site, missing)
            if s is None:
                return self._deliver(missing)
        st = self._streams[stream]
        vc = st.vc
        if st.host_epoch != self._host_epoch:
            _join(vc, self._host)
            st.host_epoch = self._host_epoch
        tick = vc[stream] = vc[stream] + 1
        acc = Access(stream, tick, is_write, op, site, args)
        found: list = []
        prior = s.last_write
        if prior.stream != stream and vc.get(prior.stream, 0) < prior.clock:
            found.append(DataRace(storage, s.address, acc, prior, s.alloc_site))
        if s.concurrent_writes is not None:
            _races(storage, s, acc, vc, s.concurrent_writes, found)
        if is_write:
            if s.reads:
                s.reads = _races(storage, s, acc, vc, s.reads, found)
            # the writes acc is not ordered after stay beside it; the rest are before it
            s.concurrent_writes = (
                {f.prior.stream: f.prior for f in found if f.prior.is_write} or None if found else None
            )
            s.last_write = acc
            s.last_write_on[stream] = acc
        else:
            s.reads[stream] = acc
        s.last_use[stream] = acc
        if s.previous is not None:
            self._check_reuse(storage, s, acc, vc, found)
        if found:
            return self._deliver(found)
        return found

    def read(self, storage, stream, op=None, site=None) -> list:
        return self.access(storage, stream, False, op, site)

    def write(self, storage, stream, op=None, site=None) -> list:
        return self.access(storage, stream, True, op, site)

    def record_stream(self, storage: Hashable, stream: Stream, site: Site = None) -> list:
        """``x.record_stream(stream)``: the free waits for everything queued
        on ``stream`` up to the free, whenever the call was made."""
        found: list = []
        s = self._live_or_report(storage, stream, "record_stream", site, found)
        if s is not None and stream != s.alloc_stream:
            if s.recorded is None:
                s.recorded = set()
            s.recorded.add(stream)
        return self._deliver(found)

    def erase_stream(self, storage: Hashable, stream: Stream, site: Site = None) -> list:
        """torch_npu's eraseStream: withdraws an earlier record_stream."""
        found: list = []
        s = self._live_or_report(storage, stream, "erase_stream", site, found)
        if s is not None and s.recorded is not None:
            s.recorded.discard(stream)
        return self._deliver(found)

    def record_use(self, storage: Hashable, stream: Stream, site: Site = None) -> list:
        """``record_use(x, stream)``: the free waits for what is queued on
        ``stream`` now (and what that is ordered after), not later work."""
        found: list = []
        s = self._live_or_report(storage, stream, "record_use", site, found)
        if s is not None and stream != s.alloc_stream:
            if s.use_cover is None:
                s.use_cover = {}
            _join(s.use_cover, self._now(stream))
        return self._deliver(found)

    def free(self, storage: Hashable, site: Site = None) -> list:
        """The storage's last reference is gone; returns the new findings.
        ``site`` may be a zero-argument callable returning the site: it is
        called only if a finding needs it (capturing a stack costs)."""
        s = self._live.pop(storage, None)
        if s is None:
            site = site() if callable(site) else site
            first = self._freed.get(storage, _NOT_FREED)
            reason = "unknown" if first is _NOT_FREED else "double"
            return self._deliver([InvalidFree(storage, reason, site, None if first is _NOT_FREED else first)])
        if s.address is not None:
            self._by_address.pop(s.address, None)
        if self._remember_frees:
            if callable(site):
                site = site()
            self._freed[storage] = site
            if len(self._freed) > self._remember_frees:
                self._freed.popitem(last=False)
        found = self._uncovered(storage, s, None if callable(site) else site, live=False)
        if not found:
            return found
        if callable(site):
            site = site()
            found = [replace(f, free_site=site) for f in found]
        for finding in found:
            self._leave_outstanding(storage, s, finding)
        return self._deliver(found)

    # -- reading findings -----------------------------------------------------
    def uncovered_live(self, storages: Optional[Iterable[Hashable]] = None) -> list:
        """For live storages, the cross-stream uses a free right now would
        leave uncovered (not retained: computed on each call)."""
        keys = self._live.keys() if storages is None else storages
        out: list = []
        for storage in keys:
            s = self._live.get(storage)
            if s is not None:
                out.extend(self._uncovered(storage, s, None, live=True))
        return out

    def flush(self) -> list:
        """Returns the retained findings (and clears them), followed by the
        live storages' would-be uncovered uses."""
        retained, self.findings = self.findings, []
        return retained + self.uncovered_live()

    def allocator_holds(self, free: UncoveredFree) -> None:
        """The allocator will not hand out ``free``'s memory before its use is
        done (the shim, told of the use by ``note_use``): no reuse can race
        with it, whatever the program does."""
        for rec in self._outstanding.retire(lambda r: r.free is free):
            rec.free.outcome.held_by_allocator = True

    def outstanding_uses(self) -> int:
        """How many uses left by uncovered frees are still tracked."""
        return len(self._outstanding.records)

    # -- internals -------------------------------------------------------------
    def _stream(self, stream: Stream) -> _Stream:
        try:
            return self._streams[stream]
        except KeyError:
            raise ModelInputError(f"unknown stream {stream!r}; call create_stream first") from None

    def _check_event(self, event: Hashable) -> None:
        if event not in self._events:
            raise ModelInputError(f"unknown event {event!r}; call create_event first")

    def _recorded_clock(self, event, waiter, site, found: list) -> Optional[Clock]:
        self._check_event(event)
        recorded = self._events[event]
        if recorded is None:
            found.append(UnrecordedEventWait(event, waiter, site))
        return recorded

    def _now(self, stream: Stream) -> Clock:
        """``stream``'s clock as of an operation the host queues now."""
        st = self._streams.get(stream)
        if st is None:
            st = self._stream(stream)
        if st.host_epoch != self._host_epoch:
            _join(st.vc, self._host)
            st.host_epoch = self._host_epoch
        return st.vc

    def _tick(self, stream: Stream, is_write: bool, op, site, args) -> Access:
        vc = self._now(stream)
        vc[stream] += 1
        return Access(stream, vc[stream], is_write, op, site, args)

    def _host_join(self, clocks: Iterable[Clock], site: Site = None) -> None:
        changed = False
        for clock in clocks:
            changed |= _join(self._host, clock)
        if changed:
            self._host_epoch = next(self._epochs)
            if self._outstanding.records:
                self._retire_completed(site)

    def _hosts_past(self, stream: Stream, clock: int) -> bool:
        """Whether every host thread has synchronised past ``(stream, clock)``."""
        self._hosts[self._host_key][0] = self._host
        ended = self._ended
        return all(entry[0].get(stream, 0) >= clock for host, entry in self._hosts.items() if host not in ended)

    def _retire_completed(self, site: Site = None) -> None:
        """Outstanding uses every host thread has synchronised past can race
        with nothing any more: every later operation is ordered after them.
        ``site``: the host wait that did it (a callable is called once)."""
        retired = self._outstanding.retire(lambda r: self._hosts_past(r.stream, r.last_use.clock))
        if retired and callable(site):
            site = site()
        for rec in retired:
            rec.free.outcome.host_synced = True
            rec.free.outcome.sync_site = site

    def _live_or_report(self, storage, stream, op, site, found: list) -> Optional[_Storage]:
        self._stream(stream)
        s = self._live.get(storage)
        if s is None:
            if storage not in self._freed:
                raise ModelInputError(f"unknown storage {storage!r}")
            found.append(UseAfterFree(storage, stream, op, site, self._freed[storage]))
        return s

    def _release_clock(self, s: _Storage) -> Clock:
        """Pointwise maximum of every point the allocator would wait for."""
        cover = dict(self._host)
        _join(cover, self._streams[s.alloc_stream].vc)
        if s.use_cover:
            _join(cover, s.use_cover)
        for stream in s.recorded or ():
            _join(cover, self._streams[stream].vc)
        return cover

    def _uncovered(self, storage, s: _Storage, site, live: bool) -> list:
        uses = s.last_use
        if not uses or (len(uses) == 1 and s.alloc_stream in uses):
            return []  # uses on the allocation stream need nothing
        if all(stream == s.alloc_stream for stream in uses):
            return []
        cover = self._release_clock(s)
        return [
            UncoveredFree(
                storage, s.address, s.size, s.alloc_stream, stream, use,
                s.alloc_site, site, live, None if live else ReuseOutcome(),
            )
            for stream, use in s.last_use.items()
            if cover.get(stream, 0) < use.clock
        ]

    def _leave_outstanding(self, storage, s: _Storage, free: UncoveredFree) -> None:
        """Keeps the use ``free`` left uncovered at the block's range, for the
        reuse checks of later owners of that memory."""
        if s.address is None or not s.size:
            return
        stream = free.usage_stream
        write = s.last_write_on.get(stream)
        if write is not None and self._hosts_past(stream, write.clock):
            write = None  # the host synchronised past it
        cover = self._release_clock(s) if write is not None else None
        if write is not None and cover.get(stream, 0) >= write.clock:
            write = None  # covered: the allocator waits for it
        rec = _Outstanding(storage, s.address, s.address + s.size, free.last_use, write, free)
        forgotten = self._outstanding.add(rec)
        if forgotten is not None:
            forgotten.free.outcome.forgotten = True

    def _link_previous_owners(self, s: _Storage) -> None:
        if not self._outstanding.records:
            return
        previous = self._outstanding.overlapping(s.address, s.address + s.size)
        if previous:
            s.previous = previous
            for rec in previous:
                rec.free.outcome.reuses += 1

    def _check_reuse(self, storage, s: _Storage, acc: Access, vc: Clock, found: list) -> None:
        """``acc`` by a new owner against the outstanding uses of earlier owners."""
        pending = False
        for rec in s.previous:
            if rec.retired:
                continue
            pending = True
            target = rec.last_use if acc.is_write else rec.last_write
            if target is None:
                continue
            outcome = rec.free.outcome
            if vc.get(target.stream, 0) >= target.clock:
                if outcome.safe_reuse is None:
                    outcome.safe_reuse = acc
                continue
            if s.raced is None:
                s.raced = set()
            elif id(rec) in s.raced:
                continue
            s.raced.add(id(rec))
            race = ReuseRace(storage, s.address, acc, s.alloc_site, rec.storage, target, rec.free)
            if outcome.race is None:
                outcome.race = race
            found.append(race)
        if not pending:
            s.previous = None

    def _deliver(self, found: list) -> list:
        """Retains ``found`` (all of it first), then tells ``on_finding``."""
        if found:
            if self.retain:
                self.findings.extend(found)
            if self.on_finding is not None:
                for finding in found:
                    self.on_finding(finding)
        return found


def _races(storage, s: _Storage, acc: Access, vc: Clock, priors: dict, found: list) -> dict:
    """Appends a race for each of ``priors`` (stream -> access) that ``acc``
    (at clock ``vc``) is not ordered after; returns those, by stream."""
    racing: dict = {}
    for prior in priors.values():
        if prior.stream != acc.stream and vc.get(prior.stream, 0) < prior.clock:
            found.append(DataRace(storage, s.address, acc, prior, s.alloc_site))
            racing[prior.stream] = prior
    return racing


_NOT_FREED = object()
