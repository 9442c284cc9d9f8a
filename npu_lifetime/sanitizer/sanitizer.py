"""``LifetimeSanitizer``: one lifetime model fed from a running program.

It is a sink: the dispatch mode (``dispatch.py``) replays each op into it,
the device backend's hub (``hub.py``) delivers stream, event and
synchronisation events, the storage table (``storages.py``) names storages,
the shim link (``shim_link.py``) brings the shim's allocations and frees,
and ``recording/watchers.py`` brings record_use / record_stream / erase_stream calls
made outside the dispatcher.  The model decides every finding; the
reporting policy (``finding_policy.py``) groups, raises or warns, and classifies
them.
"""
from __future__ import annotations

import sys
import threading
import warnings
import weakref
from collections import Counter
from _thread import RLock, get_ident
from functools import partial
from typing import Optional

import torch

from .. import storage_holders
from ..flags import flag
from ..lifetime import DataRace, ReuseRace, UncoveredFree, UnrecordedEventWait
from ..recording import stream_from_op_args
from . import accesses, arguments, dispatch, forks, report, sites, threads
from .backends import Backend, backend_for
from .hub import on_thread
from .user_names import Names
from .native import Parts, default as default_parts
from .finding_policy import ON_RACE, Findings, GroupInfo, Policy, live_info
from .shim_link import ShimLink
from .storages import StorageTable
from .suppressions import Suppressions


class LifetimeWarning(UserWarning):
    pass


class DataRaceError(RuntimeError):
    """Raised at an access that races (with ``on_race="raise"``): a data
    race, or a reuse race (a new owner's access racing with a use its
    memory's previous owner left outstanding)."""

    def __init__(self, races: list, text: str) -> None:
        super().__init__(text)
        self.races = races


def _patch_threads() -> None:
    """``Thread.start`` and ``Thread.join`` order host threads (a started
    thread after its starter, a joiner after the joined): wrapped once per
    process, they tell every enabled sanitizer, and a thread started while
    one is enabled takes the dispatch mode (``threads.py``).  Other hand-offs between
    threads (queues, locks, events) are not seen."""
    if getattr(threading.Thread.start, "_npu_lifetime", False):
        return
    start, join = threading.Thread.start, threading.Thread.join

    def start_thread(thread, *args, **kwargs):
        active = dispatch.active()
        for sanitizer in active:
            sanitizer.on_thread_start(thread)
        if active:
            threads.wrap_start(thread, dispatch.follow_this_thread)  # its ops reach the sanitizers too
        return start(thread, *args, **kwargs)

    def join_thread(thread, *args, **kwargs):
        out = join(thread, *args, **kwargs)
        if not thread.is_alive():
            for sanitizer in dispatch.active():
                sanitizer.on_thread_joined(thread)
        return out

    start_thread._npu_lifetime = join_thread._npu_lifetime = True
    threading.Thread.start, threading.Thread.join = start_thread, join_thread


class LifetimeSanitizer:
    """Tracks every access per stream and reports data races and reuse
    races (at the access) and uncovered frees (at the free); all are
    retained, grouped by site, until ``flush``.

    ``on_race``: ``raise`` (``DataRaceError``, like CSAN), ``warn``
    (``LifetimeWarning``) or ``collect``, for each new race.  ``warn_on_free``
    warns at each new uncovered free.

    What fails a check (``failing``): every race and every uncovered free,
    latent or actual (the classification is the diagnosis), invalid frees
    and uses after free; silenced only explicitly: ``suppressions`` (a
    ``Suppressions``, or the path of a suppressions file), and
    ``allow_latent`` for latent frees (never those only the allocator's
    hold kept safe).  ``strict`` also fails live storages' uses that a free
    now would leave uncovered.

    ``parts``: the implementation of each of its parts (``native.Parts``):
    C where built unless told (``native.python_parts()``: the reference).
    """

    def __init__(
        self,
        device: str = "cuda",
        on_race: str = "raise",
        warn_on_free: bool = True,
        stack_depth: int = 8,
        strict: bool = False,
        allow_latent: bool = False,
        suppressions=None,
        parts: Optional[Parts] = None,
    ) -> None:
        warn_on_free, strict, allow_latent = (flag(warn_on_free, "warn_on_free"), flag(strict, "strict"),
                                              flag(allow_latent, "allow_latent"))
        if on_race not in ON_RACE:
            raise ValueError(f"on_race must be one of {ON_RACE}, not {on_race!r}")
        depth = "stack_depth must be an int >= 0 (user frames kept per site; 0: none)"
        if isinstance(stack_depth, bool) or not isinstance(stack_depth, int):
            raise TypeError(f"{depth}, not {type(stack_depth).__name__} {stack_depth!r}")
        if stack_depth < 0:
            raise ValueError(f"{depth}, not {stack_depth}")
        self.backend: Backend = backend_for(device)
        self.backend.check_available()
        self.on_race = on_race
        self.warn_on_free = warn_on_free
        self.stack_depth = stack_depth
        suppressions = arguments.suppressions(suppressions)
        self.policy = Policy(allow_latent=allow_latent, strict=strict, suppressions=suppressions)
        self.enabled = False
        self.parts = parts = parts if parts is not None else default_parts()
        self.model = parts.model(retain=False, remember_frees=0, host=threading.main_thread().ident)
        self._host = threading.main_thread().ident  # the thread the model names as the host (set_host)
        self.storages = StorageTable(self.model, self.backend, self._free, self._free_found)
        self.names = Names(self.backend)
        self._findings = Findings(self.describe)
        self._flushed: dict = {}  # id(finding) -> GroupInfo of the last flush
        # the model's lock; entering it names the calling thread as the host
        # what the feeds acquire and release (the host check is theirs): the RLock under the lock
        self._rlock = RLock()
        self._lock = parts.host_lock(self._rlock, self)
        self._op_feed = parts.op_feed
        forks.watch(self)  # a fork from any thread leaves this lock free in the child
        self._threads: dict = {threading.main_thread().ident: weakref.ref(threading.main_thread())}  # ident -> Thread
        self._forks = weakref.WeakKeyDictionary()  # Thread started, not seen yet -> its parent's clock
        self._known_events: set = set()
        self._unchecked_before: Counter = Counter()  # accesses.UNCHECKED at enable()
        self._shim = ShimLink(self)
        self._storage_feed = self._make_storage_feed()
        self._events = self._make_event_feed()

    def _make_storage_feed(self):
        """The parts' StorageFeed over this sanitizer's storage table and
        model (``on_shim_alloc``, ``_free``, ``_trace_alloc``, ``_trace_free``
        go through it)."""
        storages, model = self.storages, self.model
        capture = partial(self.parts.capture, self.stack_depth, 0)  # 0: the innermost Python frame, the program's
        return self.parts.storage_feed(
            self, self._rlock, self._shim, storages.live, storages.sizeless, storages._ids, storages._blocks_before,
            model.allocate, model.free, model.has_stream, self._stream, on_thread, capture)

    def _make_event_feed(self):
        """The parts' EventFeed, which the device-event handlers below call.
        It binds the model's methods, ``_keep``, ``_stream`` and the lock
        now: a sanitizer that replaces them makes it again."""
        return self.parts.event_feed(self, self._rlock, self._known_events, self.model, self._stream,
                                     partial(self._sync_site, skip=2), self._keep)

    # -- enabling ---------------------------------------------------------------
    def enable(self) -> "LifetimeSanitizer":
        if self.enabled:
            return self
        _patch_threads()
        self.backend.connect(default_parts())  # the device's deliveries, shared by its sanitizers
        self.storages.take_snapshot()
        self._unchecked_before = Counter(accesses.UNCHECKED)
        try:  # all or nothing: a failure leaves no part connected
            self._shim.connect()
            self.backend.hub.add(self)
            dispatch.activate(self)
        except BaseException:
            self._disconnect()
            raise
        self.enabled = True
        return self

    def disable(self) -> None:
        if not self.enabled:
            return
        self._disconnect()
        self.enabled = False

    def _disconnect(self) -> None:
        dispatch.deactivate(self)
        self.backend.hub.remove(self)
        self._shim.disconnect()

    def __enter__(self) -> "LifetimeSanitizer":
        return self.enable()

    def __exit__(self, *exc) -> None:
        self.disable()

    # -- results -------------------------------------------------------------------
    @property
    def findings(self) -> list:
        """Findings retained so far, one per group (not cleared)."""
        with self._lock:
            return self._findings.retained()

    def flush(self) -> list:
        """The retained findings (cleared), then, for storages still alive,
        the cross-stream uses a free right now would leave uncovered."""
        with self._lock:
            retained, infos = self._findings.drain()
            live = Findings(self.describe)
            live.add(self.model.uncovered_live())
            live_found, live_infos = live.drain()
        self._flushed = {**infos, **live_infos}
        return retained + live_found

    def flush_by_stream(self) -> dict:
        """``flush()`` grouped by usage stream (the access stream of a race)."""
        grouped: dict = {}
        for f in self.flush():
            stream = getattr(f, "usage_stream", None) or getattr(getattr(f, "access", None), "stream", None)
            grouped.setdefault(self.describe(stream) if stream is not None else "host", []).append(f)
        return grouped

    def info(self, finding) -> GroupInfo:
        """How many times the finding's group occurred, and whether it is
        actual or latent (and why)."""
        arguments.finding("info", finding)
        with self._lock:
            found = self._findings.info(finding)
        if found is None:
            found = self._flushed.get(id(finding))
        if found is None:
            found = live_info(finding) if getattr(finding, "live", False) else GroupInfo(1, False, ())
        return found

    def count(self, finding) -> int:
        return self.info(finding).count

    @property
    def strict(self) -> bool:
        return self.policy.strict

    def failing(self, findings: list) -> list:
        """Those of ``findings`` that fail the check (see ``Policy``)."""
        findings = arguments.findings("failing", findings) or []
        return [f for f in findings if self.info(f).fails(f, self.policy)]

    def verdict(self, finding) -> tuple:
        """``(fails, why not)`` for ``finding`` (see ``Policy.verdict``)."""
        arguments.finding("verdict", finding)
        return self.policy.verdict(finding, self.info(finding))

    def summary(self, findings: list, reports: int = 5) -> dict:
        """A JSON-ready summary of ``findings``: counts by kind (occurrences
        included), those that fail the check, the reasons the latent ones
        are latent, those silenced (and why), and the first ``reports``
        reports (failing findings first)."""
        findings = arguments.findings("summary", findings) or []
        if isinstance(reports, bool) or not isinstance(reports, int) or reports < 0:
            raise TypeError(f"summary: reports must be an int >= 0, not {reports!r:.60}")

        kinds, failing, reasons, silenced = Counter(), Counter(), Counter(), Counter()
        failing_findings = []
        for f in findings:
            info = self.info(f)
            kinds[f.kind] += info.count
            fails, why_not = self.policy.verdict(f, info)
            if fails:
                failing[f.kind] += info.count
                failing_findings.append(f)
            else:
                silenced[why_not] += info.count
            if isinstance(f, UncoveredFree) and not info.actual:
                for reason, n in info.reasons or (("still alive", 1),):
                    reasons[reason] += n
        others = [f for f in findings if all(f is not g for g in failing_findings)]
        return {
            "findings": dict(kinds), "failing": dict(failing), "latent_reasons": dict(reasons),
            "silenced": dict(silenced),
            "reports": [self.report([f]) for f in (failing_findings + others)[:reports]],
        }

    def describe(self, stream_key) -> str:
        """A stream as the program knows it: the device's name for it and the
        variable it was assigned to when created (``sim stream 3 (`side`)``)."""
        return self.names(arguments.stream_key("describe", stream_key))

    def report(self, findings: Optional[list] = None) -> str:
        findings = arguments.findings("report", findings)
        text = report.format_findings(self.findings if findings is None else findings,
                                      self.names, self.info, self.policy)
        unchecked = self.not_checked()
        if unchecked:
            kinds = ", ".join(f"{n} x {kind}" for kind, n in sorted(unchecked.items()))
            text += f"\nnot checked (tensors with memory but no storage this sanitizer can track): {kinds}\n"
        return text

    def not_checked(self) -> dict:
        """Kinds of tensor, with counts, that ops touched since ``enable()``
        whose memory the sanitizer cannot track (``storage_holders``)."""
        return dict(Counter(accesses.UNCHECKED) - self._unchecked_before)

    def to_json(self, findings: Optional[list] = None) -> list:
        findings = arguments.findings("to_json", findings)
        return report.to_json(self.findings if findings is None else findings,
                              self.names, self.info, self.policy)

    # -- ops, from the dispatch mode ----------------------------------------------------
    def apply_op(self, feed: list, site, op_name: str) -> Optional[Exception]:
        """Replays one op (its in-op events and accesses, in device order);
        returns the error to raise for a new race under ``on_race="raise"``."""
        races: list = []
        with self._lock:
            for name, args in feed:
                if name == "accesses":
                    races += self._accesses(*args, op_name, site)
                else:
                    getattr(self, name)(*args)
            new = self._findings.add(races) if races else ()
        return self._announce_races(new) if new else None

    def apply_accesses(self, stream: tuple, found: list, site, op_name: str) -> Optional[Exception]:
        """``apply_op`` for the common op (no in-op event): its accesses on ``stream``."""
        with self._lock:
            races = self._accesses(stream, found, stream, op_name, site)
            new = self._findings.add(races) if races else ()
        return self._announce_races(new) if new else None

    def _accesses(self, stream: tuple, found: list, fresh_stream: tuple, op_name: str, site) -> list:
        model, storages = self.model, self.storages
        if not model.has_stream(stream):
            self._stream(stream)
        return self._op_feed(found, storages.live, storages.sizeless, self._first_sight, model.set_size,
                             model.access, stream, fresh_stream, op_name, site)

    def _first_sight(self, a, fresh_stream: tuple, site) -> int:
        """The storage id for an access to a storage not in the table: a
        fresh output allocated by the op (simulated device), else one from
        before tracking."""
        if a.fresh and self.backend.allocations_by_first_sight:
            sid = self._storage_feed.allocate(a.storage, a.nbytes, fresh_stream, site)  # StorageTable.allocate
            if a.tensor is not None:
                self.backend.watch(a.tensor, self._free, sid)
            return sid
        return self.storages.adopt(a.storage, a.nbytes, a.device_index, a.tensor)

    def lifetime_op(self, func, args: tuple, kwargs: dict) -> None:
        """``aten::record_stream`` and ``npu_lifetime::record_use`` seen by the
        dispatch mode (no accesses)."""
        tensor = args[0]
        if not isinstance(tensor, torch.Tensor) or not self.backend.tracks(tensor):
            return
        if func is torch.ops.aten.record_stream.default:
            stream = args[1] if len(args) > 1 else kwargs["s"]
            self._storage_call(tensor, self.backend.stream_key(stream), self.model.record_stream)
        else:
            stream = stream_from_op_args(*args[1:])
            self._storage_call(tensor, self.backend.stream_key(stream), self.model.record_use)

    # -- lifetime calls seen outside the dispatcher (watchers.notify) ---------------------
    def record_use(self, tensor: torch.Tensor, stream_key: tuple) -> None:
        arguments.tensor("record_use", tensor)
        arguments.stream_key("record_use", stream_key)
        self._storage_call(tensor, stream_key, self.model.record_use)

    def record_stream(self, tensor: torch.Tensor, stream_key: tuple) -> None:
        arguments.tensor("record_stream", tensor)
        arguments.stream_key("record_stream", stream_key)
        self._storage_call(tensor, stream_key, self.model.record_stream)

    def erase_stream(self, tensor: torch.Tensor, stream_key: tuple) -> None:
        arguments.tensor("erase_stream", tensor)
        arguments.stream_key("erase_stream", stream_key)
        self._storage_call(tensor, stream_key, self.model.erase_stream)

    def declare_access(self, tensor: torch.Tensor, stream_key: tuple, is_write: bool, what: str) -> None:
        """An access no op shows (a library given the raw pointer): fed as
        an op's access to each storage holding ``tensor``'s memory.  Raises
        the race it makes when ``on_race`` is "raise", as an op would."""
        arguments.tensor("declare_access", tensor)
        arguments.stream_key("declare_access", stream_key)
        if not self.backend.tracks(tensor):
            return
        site = self.parts.capture(self.stack_depth, 1)
        found = []
        for held in storage_holders.holders(tensor):
            access = accesses.PythonStorageAccess(held.untyped_storage().data_ptr(), held, held.device.index or 0, False,
                                                 True)
            access.is_write = is_write
            access.names.append("declared")
            found.append(access)
        raised = self.apply_accesses(stream_key, found, site, what)  # (it registers an unseen stream)
        if raised is not None:
            raise raised

    def track_allocation(self, tensor: torch.Tensor, stream_key: tuple) -> None:
        """A storage allocated on ``stream_key`` by an allocator the backend
        does not see (the simulated device's hand-off harness)."""
        arguments.tensor("track_allocation", tensor)
        arguments.stream_key("track_allocation", stream_key)
        site = self.parts.capture(self.stack_depth, 1)
        storage = tensor.untyped_storage()
        with self._lock:
            self.storages.allocate(storage.data_ptr(), storage.nbytes(), self._stream(stream_key), site, tensor)

    def _storage_call(self, tensor, stream_key, call) -> None:
        if not self.backend.tracks(tensor):
            return
        site = self.parts.capture(self.stack_depth, 2)
        for held in storage_holders.holders(tensor):  # its own storage, or those holding its memory
            storage = held.untyped_storage()
            with self._lock:
                stream = self._stream(stream_key)
                sid = self.storages.get(storage.data_ptr())
                if sid is None:
                    sid = self.storages.adopt(storage.data_ptr(), storage.nbytes(), held.device.index or 0, held)
                found = call(sid, stream, site=site)
                if found:
                    self._findings.add(found)

    # -- host threads ---------------------------------------------------------------------------
    def _set_host(self) -> None:
        """Called with the lock held when the calling thread is not the
        model's host: it becomes the host.  A thread seen for the first time
        starts with the clock its starter had (``on_thread_start``); threads
        that ended are forgotten then."""
        ident = get_ident()
        model = self.model
        thread = threading.current_thread()
        known = self._threads.get(ident)
        if known is None or known() is not thread:  # new, or an ident reused by a new thread
            if known is not None:
                model.forget_host(ident)
            alive = {t.ident for t in threading.enumerate()}
            for ended in [i for i in self._threads if i not in alive]:
                model.end_host(ended)  # its clock stays for a join
            self._threads[ident] = weakref.ref(thread)
            started_after = self._forks.pop(thread, None)
            if started_after is not None:
                model.fork_host(ident, started_after)
        model.set_host(ident)
        self._host = ident
        if isinstance(thread, threading._DummyThread):
            # a thread started from C++ (autograd's engine threads, a backend's workers) does what a
            # Python thread asked of it: it is taken as ordered after what the Python threads waited for
            model.follow_hosts(i for i, t in self._threads.items() if not isinstance(t(), threading._DummyThread))

    def on_thread_start(self, thread) -> None:
        """``thread`` is about to start: it begins ordered after what the
        starting thread waited for."""
        with self._lock:
            self._forks[thread] = self.model.host_clock()

    def on_thread_joined(self, thread) -> None:
        """The calling thread joined ``thread`` (it ended): ordered after
        everything ``thread`` waited for."""
        with self._lock:
            known = self._threads.pop(thread.ident, None)
            if known is not None and known() is thread:
                self.model.join_host(thread.ident)

    # -- device events (from the hub) -------------------------------------------------------
    def _stream(self, key: tuple) -> tuple:
        if not self.model.has_stream(key):  # a new stream: its key is checked once (the on_* handlers' too)
            arguments.stream_key("a stream", key)
            self.model.create_stream(key, device=key[0])
        return key

    def on_stream_created(self, key) -> None:
        """The device made the stream ``key``: named by the line that made it
        where each creation is one constructor call (the simulated device);
        CUDA's and NPU's come a whole pool at once and name nothing (their
        constructor calls come as ``on_stream_constructed``)."""
        if self.backend.creation_is_a_constructor_call:
            self.on_stream_constructed(key)
            return
        with self._lock:
            self._stream(key)

    def on_stream_constructed(self, key) -> None:
        """A ``Stream()`` call of the program returned the stream ``key``.
        A pool hands its streams out again: a stream already named costs no
        site capture."""
        if self.names.named(key):
            return
        site = self._site()
        with self._lock:
            self._stream(key)
            self.names.note_stream(key, site)

    def on_event_created(self, event) -> None:
        self._events.on_event_created(event)

    def on_event_deleted(self, event) -> None:
        self._events.on_event_deleted(event)

    def on_event_record(self, event, key) -> None:
        self._events.on_event_record(event, key)

    def on_event_wait(self, event, key) -> None:
        self._events.on_event_wait(event, key)

    def on_event_sync(self, event) -> None:
        with self._lock:
            if event in self._known_events:
                self._keep(self.model.synchronize_event(event, site=self._sync_site))

    def on_current_stream_waits(self, event) -> None:
        """The current stream waits for ``event`` (``Work.block_current_stream``)."""
        self.on_event_wait(event, self.backend.current_stream(self.backend.current_device()))

    def on_stream_sync(self, key) -> None:
        self._events.on_stream_sync(key)

    def on_device_sync(self, device) -> None:
        self._events.on_device_sync(device)

    def _sync_site(self, skip: int = 3):
        """Where the host waited (asked only when a latent free's reason
        needs it).  ``skip``: the first frame the capture may name, counted
        from its own (0): past this method (1) and the ``on_*`` handler
        (2) that called the model, so the handler's caller (3; 2 for a
        handler in C, which has no frame).  The walk passes over this
        package's and torch's frames up to the program's."""
        frame = on_thread.frame
        return frame.site if frame is not None else self.parts.capture(self.stack_depth, skip - 1)

    def on_wait_stream(self, waiter, waitee) -> None:
        self._events.on_wait_stream(waiter, waitee)

    def on_trace_alloc(self, address, device) -> None:
        """The device's allocation trace (``Hub.direct``; the native delivery
        calls ``_trace_alloc`` itself)."""
        self._trace_alloc(address, self.backend.current_stream(device))

    def on_trace_free(self, address) -> None:
        found = self._trace_free(address)
        if found:
            self._free_found(found)

    def _trace_alloc(self, address, key) -> None:
        """An allocation the device's trace reports, on the stream ``key``
        (its size learnt at the first access; skipped while the shim is connected)."""
        self._storage_feed.trace_alloc(address, key)

    def _trace_free(self, address) -> Optional[list]:
        """A free the device's trace reports: the model's findings, for
        ``_free_found`` (None while the shim is connected)."""
        return self._storage_feed.trace_free(address)

    def on_host_read(self, tensor, what: str) -> None:
        """The host reads ``tensor`` back (``.tolist()``, ``.cpu()``,
        ``.numpy()`` on the simulated device): a read on the current stream,
        then the host waits for it, as a blocking copy does on a device."""
        if not self.backend.tracks(tensor):
            return
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return
        address = storage.data_ptr()
        if not address:
            return
        site = self._site()
        stream = self._stream(self.backend.current_stream(self.backend.current_device()))
        with self._lock:
            sid = self.storages.get(address)
            if sid is None:
                sid = self.storages.adopt(address, storage.nbytes(), 0, tensor)
            found = self.model.access(sid, stream, False, what, site, ("self",))
            self.model.synchronize_stream(stream)
        self._raise_new_races(found)

    def storage_moved(self, before: int, site) -> None:
        """A tensor's storage grew into a new block (``resize_``): the old one
        is freed.  A device's allocation trace reports that free itself; on
        the simulated device it is noted here."""
        if self.backend.allocations_by_first_sight and before:
            self._free(before, site=site)

    def on_storage_read(self, storage, address: int) -> None:
        """The host device copies ``storage``'s bytes (a storage resize to a
        larger size, outside the dispatcher) on the current stream."""
        site = self._site()
        stream = self._stream(self.backend.current_stream(self.backend.current_device()))
        with self._lock:
            sid = self.storages.get(address)
            if sid is None:
                sid = self.storages.adopt(address, storage.nbytes(), 0, storage)
            found = self.model.access(sid, stream, False, "UntypedStorage.resize_", site, ("self",))
        self._raise_new_races(found)

    def on_storage_resized(self, storage, before: int, after: int, copied: bool) -> None:
        """``untyped_storage().resize_`` moved ``storage`` from ``before`` to
        ``after`` (0: no memory): the old block is freed there, the new one
        allocated on the current stream (written when the old bytes were
        copied into it)."""
        site = self._site()
        if before:
            self._free(before, site=site)
        if after:
            stream = self._stream(self.backend.current_stream(self.backend.current_device()))
            with self._lock:
                sid = self.storages.allocate(after, storage.nbytes(), stream, site, storage)
                found = self.model.access(sid, stream, True, "UntypedStorage.resize_", site, ("self",)) \
                    if copied else []
            self._raise_new_races(found)

    def _raise_new_races(self, found: list) -> None:
        if found:
            with self._lock:
                new = self._findings.add(found)
            error = self._announce_races(new) if new else None
            if error is not None:
                raise error

    def on_shim_alloc(self, address: int, size: int, key: tuple) -> None:
        self._storage_feed.allocate(address, size, key)

    def allocator_holds(self, free: UncoveredFree) -> None:
        with self._lock:
            self.model.allocator_holds(free)
            self._findings.mark_held(free)

    def on_record_stream_ptr(self, address, key) -> None:
        with self._lock:
            sid = self.storages.get(address)
            if sid is not None:
                self._keep(self.model.record_stream(sid, self._stream(key)))

    def on_erase_stream_ptr(self, address, key) -> None:
        with self._lock:
            sid = self.storages.get(address)
            if sid is not None:
                self._keep(self.model.erase_stream(sid, self._stream(key)))

    def _free(self, address, sid=None, site=None) -> list:
        """A storage's memory was freed; returns the model's findings (the
        shim defers reuse for the uncovered ones).  ``sid``: only if that
        storage is still the one at ``address`` (a watched storage's death)."""
        found = self._free_in_table(address, sid, site)
        if found:
            self._free_found(found)
        return found

    def _free_in_table(self, address, sid=None, site=None) -> list:
        """The free in the storage table and the model: their findings."""
        if site is None:
            return self._storage_feed.free(address) if sid is None else self._storage_feed.free(address, sid)
        with self._lock:
            return self.storages.free(address, site, sid)

    def _free_found(self, found: list) -> None:
        """Retains a free's findings; warns of the new uncovered frees."""
        with self._lock:
            new = self._findings.add(found)
        if new and self.warn_on_free:
            self._warn_frees(new)

    def _site(self):
        """The current op's site when inside one, else a fresh capture."""
        frame = on_thread.frame
        return frame.site if frame is not None else self.parts.capture(self.stack_depth, 2)


    # -- announcing ---------------------------------------------------------------------
    def _keep(self, found: list) -> None:
        """Retains ``found``; a wait on an event never recorded is a no-op on
        the device (CUDA and CANN complete it at once, CSAN reports
        nothing): it orders nothing and is not a finding."""
        if found:
            found = [f for f in found if not isinstance(f, UnrecordedEventWait)]
            if found:
                self._findings.add(found)

    def _announce_races(self, new: list) -> Optional[Exception]:
        races = [f for f in new if isinstance(f, (DataRace, ReuseRace))]
        if not races or self.on_race == "collect":
            return None
        text = report.format_findings(races, self.names, self.info, self.policy)
        if self.on_race == "raise":
            print(text, file=sys.stderr)
            return DataRaceError(races, text)
        warnings.warn(text, LifetimeWarning, stacklevel=_program_level())
        return None

    def _warn_frees(self, new) -> None:
        """Frees happen in destructors and allocator hooks, where an exception
        (a warning turned into an error) cannot reach the program: the finding
        is retained either way, and reported by ``flush``."""
        frees = [f for f in new if isinstance(f, UncoveredFree)]
        if not frees:
            return
        try:
            warnings.warn(report.format_findings(frees, self.names, self.info, self.policy), LifetimeWarning,
                          stacklevel=2)
        except Warning:
            pass


def _program_level() -> int:
    """The ``stacklevel`` that makes a warning name the program's line: the
    first frame above the caller of the caller outside this package, torch
    and the standard library (the dispatch path to here has Python frames
    or none, _dispatch.c); 1 where there is no such frame."""
    frame, level = sys._getframe(2), 2  # stacklevel 1: the caller (the function that warns)
    while frame is not None and sites.internal(frame.f_code.co_filename):
        frame, level = frame.f_back, level + 1
    return level if frame is not None else 1
