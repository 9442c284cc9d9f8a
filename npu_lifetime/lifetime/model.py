"""The lifetime model: happens-before between streams and the coverage rules
for frees.  This module is the single source of truth for both; everything
else (the torch front end, the schedule runner) only feeds it events.

Happens-before is tracked with vector clocks.  Every stream ``S`` has a clock
``vc[S]`` mapping each stream to the latest of its operations that ``S`` is
ordered after; ``S``'s own entry counts its operations.  An event holds a copy
of its stream's clock at the record; waiting joins it in.  The host has a
clock too: a host synchronisation joins into it, and every operation the host
queues afterwards is ordered after it (joined lazily, once per host epoch).

An access at ``(U, c)`` happens before a point with clock ``P`` iff
``P[U] >= c``.  A free of a block allocated on ``A`` is covered for a use
``(U, c)`` iff the use happens before one of the release points the
allocator waits for before handing the block out again:

* the free itself on ``A`` (``A``'s clock joined with the host's),
* each recorded stream ``R`` at the free (record_stream records there),
* each ``record_use`` call (an event on its stream at the call).

Since each test reads a single component, the release points fold into one
clock (their pointwise maximum) and only the last use per stream matters.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Hashable, Iterable, Optional

from .findings import (
    Access,
    DataRace,
    Finding,
    InvalidFree,
    Site,
    Stream,
    UncoveredFree,
    UnrecordedEventWait,
    UseAfterFree,
)

Clock = dict  # stream -> int

# How many freed storage ids are remembered to tell a double free from a
# free of a pointer that was never allocated.
_FREED_MEMORY = 1 << 16


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
        "last_write", "reads", "last_use", "recorded", "use_cover",
    )

    def __init__(self, address, size, alloc_stream, alloc_site, allocation: Access):
        self.address = address
        self.size = size
        self.alloc_stream = alloc_stream
        self.alloc_site = alloc_site
        # Data-race state: the last write and the latest read per stream since.
        self.last_write: Access = allocation
        self.reads: dict = {}
        # Lifetime state: the latest use per stream, recorded streams, and the
        # pointwise maximum of the clocks of every record_use call.
        self.last_use: dict = {}
        self.recorded: set = set()
        self.use_cover: Clock = {}


class LifetimeModel:
    """Feeds on stream, event, synchronisation and storage events; reports
    data races at the access and uncovered frees at the free.

    Every finding is appended to ``findings`` (see ``flush``) and, if given,
    passed to ``on_finding`` at once.
    """

    def __init__(self, on_finding: Optional[Callable[[Finding], None]] = None) -> None:
        self._streams: dict = {}
        self._events: dict = {}  # event -> Clock of its last record, or None
        self._host: Clock = {}
        self._host_epoch = 0
        self._live: dict = {}
        self._by_address: dict = {}
        self._freed: OrderedDict = OrderedDict()  # storage -> free site
        self.findings: list = []
        self.on_finding = on_finding

    # -- streams and events -------------------------------------------------
    def create_stream(self, stream: Stream, device: int = 0) -> None:
        if stream not in self._streams:
            self._streams[stream] = _Stream(stream, device)

    def has_stream(self, stream: Stream) -> bool:
        return stream in self._streams

    def create_event(self, event: Hashable) -> None:
        self._events.setdefault(event, None)

    def event_recorded(self, event: Hashable) -> bool:
        return self._events.get(event) is not None

    def delete_event(self, event: Hashable) -> None:
        self._events.pop(event, None)

    def record_event(self, event: Hashable, stream: Stream) -> None:
        self._check_event(event)
        self._events[event] = dict(self._now(stream))

    def wait_event(self, stream: Stream, event: Hashable, site: Site = None) -> None:
        """``stream`` waits for ``event`` (cudaStreamWaitEvent)."""
        vc = self._now(stream)
        recorded = self._recorded_clock(event, stream, site)
        if recorded is not None:
            _join(vc, recorded)

    def wait_stream(self, waiter: Stream, waitee: Stream) -> None:
        """``waiter.wait_stream(waitee)``: an event on waitee, waited on by waiter."""
        _join(self._now(waiter), self._now(waitee))

    def synchronize_event(self, event: Hashable, site: Site = None) -> None:
        """The host waited for ``event`` (``synchronize()``, or ``query()``
        that returned True)."""
        recorded = self._recorded_clock(event, None, site)
        if recorded is not None:
            self._host_join([recorded])

    event_query_complete = synchronize_event

    def synchronize_stream(self, stream: Stream) -> None:
        self._host_join([self._now(stream)])

    def synchronize_device(self, device: Optional[int] = None) -> None:
        self._host_join(
            s.vc for s in self._streams.values() if device is None or s.device == device
        )

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
            allocation = self._tick(stream, True, "<allocation>", site)
        self._freed.pop(storage, None)
        self._live[storage] = _Storage(address, size, stream, site, allocation)
        if address is not None:
            self._by_address[address] = storage

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
    ) -> None:
        s = self._live_or_report(storage, stream, op or ("write" if is_write else "read"), site)
        if s is None:
            return
        acc = self._tick(stream, is_write, op, site)
        vc = self._streams[stream].vc
        self._check_race(storage, s, acc, s.last_write, vc)
        if is_write:
            for read in s.reads.values():
                self._check_race(storage, s, acc, read, vc)
            s.last_write = acc
            s.reads = {}
        else:
            s.reads[stream] = acc
        s.last_use[stream] = acc

    def read(self, storage, stream, op=None, site=None) -> None:
        self.access(storage, stream, False, op, site)

    def write(self, storage, stream, op=None, site=None) -> None:
        self.access(storage, stream, True, op, site)

    def record_stream(self, storage: Hashable, stream: Stream, site: Site = None) -> None:
        """``x.record_stream(stream)``: the free waits for everything queued
        on ``stream`` up to the free, whenever the call was made."""
        s = self._live_or_report(storage, stream, "record_stream", site)
        if s is not None and stream != s.alloc_stream:
            s.recorded.add(stream)

    def erase_stream(self, storage: Hashable, stream: Stream, site: Site = None) -> None:
        """torch_npu's eraseStream: withdraws an earlier record_stream."""
        s = self._live_or_report(storage, stream, "erase_stream", site)
        if s is not None:
            s.recorded.discard(stream)

    def record_use(self, storage: Hashable, stream: Stream, site: Site = None) -> None:
        """``record_use(x, stream)``: the free waits for what is queued on
        ``stream`` now (and what that is ordered after), not later work."""
        s = self._live_or_report(storage, stream, "record_use", site)
        if s is not None and stream != s.alloc_stream:
            _join(s.use_cover, self._now(stream))

    def free(self, storage: Hashable, site: Site = None) -> list:
        """The storage's last reference is gone; returns the new findings."""
        s = self._live.pop(storage, None)
        if s is None:
            first = self._freed.get(storage, _NOT_FREED)
            reason = "unknown" if first is _NOT_FREED else "double"
            finding = InvalidFree(storage, reason, site, None if first is _NOT_FREED else first)
            self._report(finding)
            return [finding]
        if s.address is not None:
            self._by_address.pop(s.address, None)
        self._freed[storage] = site
        if len(self._freed) > _FREED_MEMORY:
            self._freed.popitem(last=False)
        found = self._uncovered(storage, s, site, live=False)
        for finding in found:
            self._report(finding)
        return found

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

    # -- internals -------------------------------------------------------------
    def _stream(self, stream: Stream) -> _Stream:
        try:
            return self._streams[stream]
        except KeyError:
            raise ModelInputError(f"unknown stream {stream!r}; call create_stream first") from None

    def _check_event(self, event: Hashable) -> None:
        if event not in self._events:
            raise ModelInputError(f"unknown event {event!r}; call create_event first")

    def _recorded_clock(self, event, waiter, site) -> Optional[Clock]:
        self._check_event(event)
        recorded = self._events[event]
        if recorded is None:
            self._report(UnrecordedEventWait(event, waiter, site))
        return recorded

    def _now(self, stream: Stream) -> Clock:
        """``stream``'s clock as of an operation the host queues now."""
        st = self._stream(stream)
        if st.host_epoch != self._host_epoch:
            _join(st.vc, self._host)
            st.host_epoch = self._host_epoch
        return st.vc

    def _tick(self, stream: Stream, is_write: bool, op, site) -> Access:
        vc = self._now(stream)
        vc[stream] += 1
        return Access(stream, vc[stream], is_write, op, site)

    def _host_join(self, clocks: Iterable[Clock]) -> None:
        changed = False
        for clock in clocks:
            changed |= _join(self._host, clock)
        if changed:
            self._host_epoch += 1

    def _check_race(self, storage, s: _Storage, acc: Access, prior: Access, vc: Clock) -> None:
        if prior.stream != acc.stream and vc.get(prior.stream, 0) < prior.clock:
            self._report(DataRace(storage, s.address, acc, prior))

    def _live_or_report(self, storage, stream, op, site) -> Optional[_Storage]:
        self._stream(stream)
        s = self._live.get(storage)
        if s is None:
            if storage not in self._freed:
                raise ModelInputError(f"unknown storage {storage!r}")
            self._report(UseAfterFree(storage, stream, op, site, self._freed[storage]))
        return s

    def _release_clock(self, s: _Storage) -> Clock:
        """Pointwise maximum of every point the allocator would wait for."""
        cover = dict(self._host)
        _join(cover, self._streams[s.alloc_stream].vc)
        _join(cover, s.use_cover)
        for stream in s.recorded:
            _join(cover, self._streams[stream].vc)
        return cover

    def _uncovered(self, storage, s: _Storage, site, live: bool) -> list:
        if all(stream == s.alloc_stream for stream in s.last_use):
            return []  # uses on the allocation stream need nothing
        cover = self._release_clock(s)
        return [
            UncoveredFree(
                storage, s.address, s.size, s.alloc_stream, stream, use,
                s.alloc_site, site, live,
            )
            for stream, use in s.last_use.items()
            if cover.get(stream, 0) < use.clock
        ]

    def _report(self, finding: Finding) -> None:
        self.findings.append(finding)
        if self.on_finding is not None:
            self.on_finding(finding)


_NOT_FREED = object()
