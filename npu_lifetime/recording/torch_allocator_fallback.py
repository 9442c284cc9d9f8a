"""record_use under a native caching allocator (no shim): an event on the
use stream plus an owned reference to the storage, released once the event
has fired, without another call.

Invariants:

* **No-op on the allocation stream.**  The caching allocators carve every
  block out of a segment that belongs to one stream, the stream current at
  allocation; the segment table comes from the allocator's own snapshot
  (``memory_snapshot()``), cached, and rebuilt when a pointer falls outside
  it.  A cached answer is trusted for skipping only while the allocator's
  segment counters (``num_device_alloc``/``num_device_free``) are
  unchanged: a freed segment's range may come back for another stream.
  When the table cannot tell, the call records (never wrong, only slower).
  Only a storage's first call per stream asks.
* **One live event per (storage, stream)**, kept in a per-stream FIFO
  ordered by record time: a repeated call re-records its event and moves it
  to the tail.  Events on one stream complete in order, so the fired
  entries of a stream are its oldest ones: a poll finds them by galloping
  over the 1st, 2nd, 4th, ... entry, then bisecting (``fired_prefix``), so
  its queries are O(log what completed) per stream with entries, not one
  per entry held or completed (the reaper holds the table's lock that
  long).
* **Released without another call.**  A call records and holds; it never
  polls (a poll would cost it a query per stream).  A background reaper
  thread polls the FIFO heads while anything is held, soon after a first
  entry, then backing off (1 ms doubling to 64 ms) while nothing fires; the
  allocator's out-of-memory observer (torch's
  ``_cuda_attach_out_of_memory_observer``) polls at once, so memory that
  fired comes back before the next allocation retries.  ``reclaim()`` polls
  on demand.  While a sanitizer watches the device the calls poll
  themselves and the reaper leaves releasing to them (frees stay in the
  program's own order for the sanitizer).
* **Capture.**  While the calling stream captures a graph the call
  degrades to ``record_stream`` (the allocator itself defers events during
  capture) and nothing is recorded or queried: an event recorded during a
  capture must never be queried.  No event is queried while any capture
  may be underway: ``GATE`` counts the captures begun and not yet ended
  through torch's graph classes (``torch.cuda.CUDAGraph``, torch_npu's
  ``NPUGraph``: ``torch.cuda.graph``, ``make_graphed_callables`` and
  cudagraph trees all go through their ``capture_begin``/``capture_end``),
  and a poll holds the gate, so no capture begins in the middle of one;
  the reaper also skips a stream the runtime says is capturing, and a call
  or ``reclaim()`` polls only when the caller's current stream is not
  capturing.  A capture begun below torch's graph classes on a stream the
  fallback holds nothing for is not seen.  With raw CUDA events (below)
  the call's check is the runtime's answer for the use stream (an error,
  the legacy stream while another captures, counts as capturing), plus the
  current stream's while the gate counts a capture; every poll asks the
  runtime about each stream before querying its head.
* **``resize_(0)``** (how FSDP frees parameters) returns a storage's memory
  while the storage object lives on, so an owned reference alone does not
  hold it.  While a storage has pending entries, ``UntypedStorage.resize_``
  to a smaller size first ``record_stream``s each pending stream (every one
  while a capture may be underway: nothing is queried then), so the
  allocator keeps the memory until that stream's work at the resize is done.
* **Fork.**  The lock is held across ``fork()``; the child starts empty,
  without a reaper, and never touches the parent's events or storages (its
  CUDA context is gone).
* **Per call: one C call.**  The entries, the FIFOs, the pool of fired
  events and a copy of the segment table live in a ``Table`` (``_holds.cpp``;
  ``_holds_py.py`` where it is not built): a call is ``Table.fast`` (the fast
  path's type checks) or ``Table.record``, which calls back into Python only
  for the device (capture check, stream handle, event record) and, on a
  first call the copied segment table cannot answer, ``_first_use``.  An
  entry owns a reference to the storage's Python object; a failed event
  record leaves no entry.
* **Raw CUDA events.**  On a CUDA build the table makes, records and
  queries its events through the CUDA runtime torch loaded
  (``CudaAPI.runtime``, ``cuda_runtime.h``: resolved from libtorch_cuda.so,
  never loading anything), with the GIL held for a record and released for
  a poll's queries; every status is checked, and one the call left as the
  thread's last error is cleared so torch's next check does not see it.
  Without the extension or the runtime, or with
  ``NPU_LIFETIME_TORCH_EVENTS=1``, events are torch's.  torch_npu's stay
  torch_npu's: it records them through its task queue, after the work
  queued before them, which a direct ``aclrtRecordEvent`` would overtake.
"""
from __future__ import annotations

import atexit
from bisect import bisect_right as _bisect_right
import contextlib
import functools
import operator
import os
import threading
import weakref
from typing import Optional

import torch

from ..native_parts import load
from . import _holds_py, watchers

# the per-call path in C++; the same table in Python where it is not built or the native parts are off
# (NPU_LIFETIME_NATIVE=0, native_parts.py)
_native_holds = load(f"{__package__}._holds")
Table: type  # the table class new fallbacks take (set by use_native_table, just below)


def use_native_table(native: bool) -> None:
    """The table the fallbacks made from now on hold their storages in:
    ``_holds.cpp``'s (where built) or ``_holds_py.py``'s (the both-ways
    tests' switch; a fallback keeps the table it was made with)."""
    global Table
    Table = _native_holds.Table if native and _native_holds is not None else _holds_py.Table


use_native_table(True)

# fork(): the gates' locks, then every fallback's, are held across it (the
# reaper takes them in that order), so the child inherits none held.
_FALLBACKS: "weakref.WeakSet" = weakref.WeakSet()
_GATES: "weakref.WeakSet" = weakref.WeakSet()


_held_across_fork: tuple = ((), ())


def _before_fork() -> None:
    global _held_across_fork
    gates, fallbacks = list(_GATES), list(_FALLBACKS)
    for gate in gates:
        gate._lock.acquire()
    for fallback in fallbacks:
        fallback._lock.acquire()
    _held_across_fork = (gates, fallbacks)


def _after_fork_in_parent() -> None:
    gates, fallbacks = _held_across_fork
    for fallback in fallbacks:
        fallback._lock.release()
    for gate in gates:
        gate._lock.release()


def _after_fork_in_child() -> None:
    gates, fallbacks = _held_across_fork
    for gate in gates:
        gate._lock = threading.Lock()
        gate._underway.clear()  # the parent's captures are not the child's (the set itself: tables read it)
    for fallback in fallbacks:
        fallback._after_fork_in_child()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)


class CaptureGate:
    """Whether a graph capture may be underway anywhere in this process.

    It counts the captures begun and not yet ended through the graph
    classes it watches (wrappers of their ``capture_begin`` and
    ``capture_end``).  ``polling()`` holds the gate for the duration of a
    poll: a capture that begins meanwhile waits for the poll to end."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._underway: set = set()  # id() of each graph between its capture_begin and capture_end
        self.watched: list = []
        _GATES.add(self)

    def watch(self, graph_class) -> None:
        """Counts the captures of ``graph_class`` (once per class)."""
        if graph_class is None or graph_class in self.watched:
            return
        begin, end = graph_class.capture_begin, graph_class.capture_end
        gate = self

        @functools.wraps(begin)
        def capture_begin(graph, *args, **kwargs):
            with gate._lock:  # waits for a poll in progress
                gate._underway.add(id(graph))
            try:
                return begin(graph, *args, **kwargs)
            except BaseException:
                with gate._lock:
                    gate._underway.discard(id(graph))
                raise

        @functools.wraps(end)
        def capture_end(graph, *args, **kwargs):
            try:
                return end(graph, *args, **kwargs)
            finally:
                with gate._lock:
                    gate._underway.discard(id(graph))

        graph_class.capture_begin, graph_class.capture_end = capture_begin, capture_end
        self.watched.append(graph_class)

    def underway(self) -> int:
        return len(self._underway)

    @contextlib.contextmanager
    def polling(self):
        """Yields True when no capture is underway; none begins before the block ends."""
        with self._lock:
            yield not self._underway


GATE = CaptureGate()
GATE.watch(getattr(torch.cuda, "CUDAGraph", None))  # at import: before any capture npu_lifetime could miss



class NativeFallback:
    """The fallback for one device API (``CudaAPI``, ``NpuAPI``, or a fake
    in tests).  Thread-safe.  ``background``: release from a reaper thread
    (the product); tests of the bookkeeping turn it off to poll by hand.
    The per-call work is one call into its ``Table`` (``_holds.cpp``, or
    ``_holds_py.py`` where the extension is not built)."""

    def __init__(self, api, gate: CaptureGate = GATE, background: bool = True) -> None:
        self.api = api
        self.gate = gate
        self.background = background
        self._reaper: Optional[_Reaper] = None
        self._observing_oom = False
        self._counts = dict.fromkeys(
            ("kept_across_resize", "polls", "released_in_background", "polls_skipped_for_capture",
             "out_of_memory_polls"), 0)
        # what a device API may lack (a fake in tests): the plain defaults
        self._stream_capturing = getattr(api, "stream_capturing", lambda stream: False)
        self._sanitized = getattr(api, "sanitized", lambda: False)
        for graph_class in getattr(api, "graph_classes", lambda: ())():
            gate.watch(graph_class)
        runtime = getattr(api, "runtime", lambda: None)() if getattr(Table, "takes_runtime", True) else None
        self._table = self._lock = Table(
            record_event=getattr(api, "record_event", None) or (lambda event, stream: event.record(stream)),
            query=api.query, new_event=api.new_event, is_capturing=api.is_capturing,
            record_stream=getattr(api, "record_stream", None) or (lambda tensor, stream: tensor.record_stream(stream)),
            handle=api.handle, device_index=api.device_index,
            first_use=self._first_use, on_first=self._start_background,
            device_flag=f"is_{getattr(api, 'device_type', 'cuda')}",
            stream_type=getattr(api, "stream_type", lambda: _NoStream)(), tensor_type=torch.Tensor,
            runtime=runtime, captures_underway=gate._underway)
        self.segments = SegmentTable(api, on_rebuild=self._table.set_segments)
        self.fast = self._table.fast  # the fast path's call: False when a check failed (nothing done)
        _FALLBACKS.add(self)  # its lock is held across fork() (_before_fork)

    # -- the call ----------------------------------------------------------------------
    def record(self, tensor: torch.Tensor, stream, storage: Optional[torch.UntypedStorage] = None,
               poll: bool = False) -> None:
        """Records an event on ``stream`` and holds the storage until it fired
        (``storage``: the tensor's, if the caller has it).  ``poll``: also
        release what has fired, now (the checked path does, while a
        sanitizer watches: frees stay in the program's own order)."""
        self._table.record(tensor, stream, storage)
        if poll:
            self.reclaim()

    def _first_use(self, storage, ptr: int, device: int, handle: int) -> bool:
        """A storage's first call on a stream that the table's copy of the
        segment table could not answer: True when it is the storage's
        allocation stream (nothing to hold).  The resize_ guard goes in
        first: the table answers later first calls without this one."""
        _guard_resize(self)
        return self.segments.is_allocation_stream(ptr, device, handle)

    @property
    def counts(self) -> dict:
        return {**self._table.counts, **self._counts}

    # -- reclaiming ---------------------------------------------------------------------------
    def reclaim(self) -> int:
        """Releases what has fired; returns how many entries.  Does nothing
        while the calling stream captures or a capture may be underway."""
        if self.api.is_capturing():
            return 0
        with self.gate.polling() as open_:
            if not open_:
                self._counts["polls_skipped_for_capture"] += 1
                return 0
            with watchers.internal_polling():
                return self._table.poll()

    def poll_in_background(self) -> Optional[int]:
        """The reaper's poll: releases what has fired, never while a capture
        may be underway nor on a stream that captures; None when it left the
        poll to the calls (a sanitizer watches the device)."""
        if self._sanitized():
            return None
        with self.gate.polling() as open_:
            if not open_:
                self._counts["polls_skipped_for_capture"] += 1
                return 0
            with watchers.internal_polling():
                released = self._table.poll(self._stream_capturing_counted)
            self._counts["polls"] += 1
            self._counts["released_in_background"] += released
        return released

    def _stream_capturing_counted(self, stream) -> bool:
        capturing = self._stream_capturing(stream)
        if capturing:
            self._counts["polls_skipped_for_capture"] += 1
        return capturing

    def on_out_of_memory(self, *_args) -> None:
        """The allocator's out-of-memory observer: release what has fired now."""
        try:
            self._counts["out_of_memory_polls"] += 1
            self.reclaim()
        except Exception:  # an observer must not raise into the allocator
            pass

    def wait_all(self) -> None:
        """Blocks until every held event has fired, then releases them.
        Refused while a capture may be underway (the host may not wait then)."""
        if self.api.is_capturing() or self.gate.underway():
            raise RuntimeError("npu_lifetime: wait_all() while a graph capture is underway")
        self._table.synchronize()
        self.reclaim()

    def held(self) -> int:
        return self._table.held()

    def has_entries(self) -> bool:
        return self._table.has_entries()

    def _start_background(self) -> None:
        """On a first entry: the out-of-memory observer (once) and the reaper."""
        if not self._observing_oom:
            self._observing_oom = True
            attach = getattr(self.api, "attach_oom_observer", None)
            if attach is not None:
                attach(_weak_method(self.on_out_of_memory))
        if not self.background:
            return
        reaper = self._reaper
        if reaper is None:
            reaper = self._reaper = _Reaper(self)
        reaper.wake()

    def stop_background(self, timeout: float = 1.0) -> None:
        reaper, self._reaper = self._reaper, None
        if reaper is not None:
            reaper.stop(timeout)

    # -- resize_ ------------------------------------------------------------------------------------
    def before_shrink(self, storage: torch.UntypedStorage) -> None:
        """``storage`` is about to give back memory: keep it for every
        pending stream (the allocator records an event there at the free)."""
        with self.gate.polling() as open_:
            may_query = open_ and not self.api.is_capturing()  # else every stream counts as pending
            with watchers.internal_polling():
                pending = self._table.pending_streams(storage, may_query)
        if pending:
            alias = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
            for stream in pending:
                self.api.record_stream(alias, stream)
            self._counts["kept_across_resize"] += len(pending)

    def guards(self, storage) -> bool:
        return self._table.guards(storage)

    # -- fork -----------------------------------------------------------------------------------
    def _after_fork_in_child(self) -> None:
        self._table.reset_after_fork()  # the parent's entries are never touched
        self._reaper = None  # its thread did not come along
        self.segments = SegmentTable(self.api, on_rebuild=self._table.set_segments)


class _NoStream:
    """The fast path's stream type for a device API without one (a fake):
    no stream is of it, so fast() always leaves the call to record()."""


def _weak_method(method):
    """A callable that calls ``method`` while its object lives (the
    allocator keeps observers forever)."""
    ref = weakref.WeakMethod(method)

    def call(*args):
        bound = ref()
        if bound is not None:
            bound(*args)

    return call


class _Reaper:
    """The thread that polls a fallback's FIFO heads while it holds anything:
    soon after it is woken (a first entry), then backing off while nothing
    fires.  A daemon; stopped at interpreter exit."""

    MIN_INTERVAL, MAX_INTERVAL = 0.001, 0.064

    def __init__(self, fallback: NativeFallback) -> None:
        self._fallback = weakref.ref(fallback)
        self._cond = threading.Condition(threading.Lock())
        self._stop = self._woken = False
        self._sleeping = False  # waiting with nothing held, until a wake
        self._thread = threading.Thread(target=self._run, name="npu_lifetime-record_use-reaper", daemon=True)
        self._thread.start()
        atexit.register(self.stop)

    def wake(self) -> None:
        """A first entry: start polling soon, if the reaper sleeps.  While it
        polls, a wake changes nothing: the table empties and refills at every
        poll of a busy program, and resetting the interval each time made the
        reaper poll every few calls (34x the polls on an H100, and every
        call paid for the contention)."""
        with self._cond:
            if self._sleeping:
                self._woken = True
                self._cond.notify()

    def stop(self, timeout: float = 1.0) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _run(self) -> None:
        interval = self.MIN_INTERVAL
        while True:
            with self._cond:
                while not self._stop and not self._woken and not self._has_entries():
                    self._sleeping = True
                    self._cond.wait()
                self._sleeping = False
                if self._woken:
                    self._woken, interval = False, self.MIN_INTERVAL
                if not self._stop:
                    self._cond.wait(interval)
                if self._stop:
                    return
            fallback = self._fallback()
            if fallback is None:
                return
            try:
                released = fallback.poll_in_background()
            except Exception:  # a runtime error: try again later, never die
                released = 0
            del fallback
            interval = self.MIN_INTERVAL if released else min(interval * 2, self.MAX_INTERVAL)

    def _has_entries(self) -> bool:
        fallback = self._fallback()
        return fallback is not None and fallback.has_entries()


class SegmentTable:
    """Which stream each of the allocator's segments belongs to (every block
    of a segment is allocated on that stream)."""

    def __init__(self, api, on_rebuild=lambda rows: None) -> None:
        self.api = api
        self._on_rebuild = on_rebuild  # (start, end, device, owner) rows after each rebuild
        self._starts: list = []  # sorted segment addresses
        self._segments: list = []  # (address, end, device, stream) in the same order
        self._version = None
        self.rebuilds = 0

    def is_allocation_stream(self, ptr: int, device: int, stream: int) -> bool:
        """Whether ``stream`` allocated the block holding ``ptr``.  A "no"
        from the cached table costs a bisect (recording when it is stale is
        only slower); a "yes" or a miss is checked against the allocator's
        segment counters first, and the table rebuilt if they moved."""
        i = _bisect_right(self._starts, ptr) - 1  # _find, inline: a storage's first call per stream pays it
        if i >= 0:
            _, end, seg_device, owner = self._segments[i]
            if ptr < end and seg_device == device and owner != stream:
                return False
        try:
            version = self.api.segment_version(device)
            if version != self._version:
                self._rebuild(version)
            return self._find(ptr, device) == stream
        except Exception:  # an allocator without snapshots or counters: record, never skip
            return False

    def _find(self, ptr: int, device: int) -> Optional[int]:
        i = _bisect_right(self._starts, ptr) - 1
        if i < 0:
            return None
        address, end, seg_device, stream = self._segments[i]
        return stream if ptr < end and seg_device == device else None

    def _rebuild(self, version) -> None:
        segments = sorted((s["address"], s["address"] + s["total_size"], s["device"], s["stream"])
                          for s in self.api.segments())
        self._segments, self._starts = segments, [s[0] for s in segments]
        self._version = version
        self.rebuilds += 1
        self._on_rebuild(segments)


# -- resize_ guard ---------------------------------------------------------------------------------
_guarded: list = []  # the fallbacks whose storages the resize_ wrapper checks


def _guard_resize(fallback: NativeFallback) -> None:
    """Wraps ``UntypedStorage.resize_`` once per process; the wrapper costs
    one list check when nothing is held."""
    if fallback in _guarded:
        return
    _guarded.append(fallback)
    original = torch.UntypedStorage.resize_
    if getattr(original, "_npu_lifetime_guard", False):
        return

    @functools.wraps(original)
    def resize_(self, size):
        if size < self.nbytes():
            for fb in _guarded:
                if fb.guards(self):
                    fb.before_shrink(self)
        return original(self, size)

    resize_._npu_lifetime_guard = True
    torch.UntypedStorage.resize_ = resize_


# -- device APIs -------------------------------------------------------------------------------------
# Every poll runs inside watchers.internal_polling(): a sanitizer does not count
# the fallback's own queries as host synchronisations the program could rely on.
def _query(event) -> bool:
    return event.query()


class CudaAPI:
    device_type = "cuda"

    def __init__(self) -> None:
        # the bindings themselves where torch has them: a Python frame costs about what the call does
        base = getattr(torch._C, "_CudaEventBase", None)
        self.query = getattr(base, "query", None) or _query
        self.record_event = getattr(base, "record", None) or (lambda event, stream: event.record(stream))
        self.is_capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None) or self.is_capturing
        self.handle = operator.attrgetter("cuda_stream")
        self.device_index = operator.attrgetter("device_index")

    def new_event(self):
        return torch.cuda.Event()

    @staticmethod
    def runtime():
        """The CUDA runtime torch calls, for the table to make, record and
        query raw events itself (no torch Event, no Python call per event);
        None keeps torch's Event: no extension, not a CUDA build, the
        runtime not found, or ``NPU_LIFETIME_TORCH_EVENTS=1``."""
        if os.environ.get("NPU_LIFETIME_TORCH_EVENTS") == "1" or torch.version.cuda is None:
            return None
        if _native_holds is None:
            return None
        CudaRuntime = _native_holds.CudaRuntime
        for path in _loaded_libraries("libtorch_cuda.so"):
            try:
                return CudaRuntime(path)
            except OSError:
                continue
        return None

    @staticmethod
    def stream_type() -> type:
        return torch.cuda.Stream

    @staticmethod
    def handle(stream) -> int:
        return stream.cuda_stream

    @staticmethod
    def device_index(stream) -> int:
        return stream.device_index

    @staticmethod
    def is_capturing() -> bool:
        return torch.cuda.is_current_stream_capturing()

    @staticmethod
    def stream_capturing(stream) -> bool:
        """Whether ``stream`` captures (the runtime's answer; an error counts as yes)."""
        try:
            with torch.cuda.stream(stream):
                return torch.cuda.is_current_stream_capturing()
        except Exception:
            return True

    def sanitized(self) -> bool:
        return watchers.watching(self.device_type)

    @staticmethod
    def record_stream(tensor, stream) -> None:
        tensor.record_stream(stream)

    @staticmethod
    def segments() -> list:
        return torch.cuda.memory_snapshot(include_traces=False)

    @staticmethod
    def segment_version(device: int) -> tuple:
        stats = torch.cuda.memory_stats_as_nested_dict(device)
        return stats["num_device_alloc"], stats["num_device_free"]

    @staticmethod
    def graph_classes() -> tuple:
        return (getattr(torch.cuda, "CUDAGraph", None),)

    @staticmethod
    def attach_oom_observer(observer) -> None:
        attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
        if attach is not None:
            try:
                attach(observer)
            except RuntimeError:  # torch's cudaMallocAsync backend has no observers: the reaper's polls remain
                pass


class NpuAPI(CudaAPI):
    """torch_npu's counterparts (written against its published API; not run
    on an NPU here)."""

    device_type = "npu"

    def __init__(self) -> None:
        import torch_npu

        self._npu = torch_npu.npu
        self._c = torch_npu._C
        self.query = _query
        self.record_event = lambda event, stream: event.record(stream)  # through torch_npu's task queue
        self.is_capturing = self._npu.is_current_stream_capturing
        self.handle = lambda stream: int(stream.npu_stream)
        self.device_index = operator.attrgetter("device_index")

    def new_event(self):
        return self._npu.Event()

    @staticmethod
    def runtime():
        """None: torch_npu records events through its task queue, after the
        work queued before them; an aclrtRecordEvent from here would go
        ahead of that work and fire early."""
        return None

    def stream_type(self) -> type:
        return self._npu.Stream

    @staticmethod
    def handle(stream) -> int:
        return int(stream.npu_stream)

    def is_capturing(self) -> bool:
        return self._npu.is_current_stream_capturing()

    def stream_capturing(self, stream) -> bool:
        try:
            with self._npu.stream(stream):
                return self._npu.is_current_stream_capturing()
        except Exception:
            return True

    def segments(self) -> list:
        return self._npu.memory_snapshot()

    def segment_version(self, device: int) -> tuple:
        stats = self._npu.memory_stats(device)
        return stats["num_device_alloc"], stats["num_device_free"]

    def graph_classes(self) -> tuple:
        return (getattr(self._npu, "NPUGraph", None),)

    def attach_oom_observer(self, observer) -> None:
        attach = getattr(self._c, "_npu_attach_out_of_memory_observer", None)
        if attach is not None:
            try:
                attach(observer)
            except RuntimeError:  # an allocator without observers: the reaper's polls remain
                pass


def _loaded_libraries(name: str) -> list:
    """Paths of the loaded libraries called ``name``: torch's own lib
    folder first, then what /proc/self/maps shows."""
    paths = [os.path.join(os.path.dirname(torch.__file__), "lib", name)]
    try:
        with open("/proc/self/maps") as maps:
            paths += sorted({line.split(None, 5)[-1].strip() for line in maps if line.rstrip().endswith("/" + name)})
    except OSError:
        pass
    return paths


class _PerDevice:
    """One ``NativeFallback`` per device type, made on first use."""

    def __init__(self) -> None:
        self._by_type: dict = {}

    def for_device(self, device_type: str) -> NativeFallback:
        fallback = self._by_type.get(device_type)
        if fallback is None:
            api = CudaAPI() if device_type == "cuda" else NpuAPI()
            fallback = self._by_type[device_type] = NativeFallback(api)
        return fallback

    def record(self, tensor: torch.Tensor, stream) -> None:
        """The checked path's way in: while a sanitizer watches the device the
        call also releases what fired (the reaper leaves that to calls then)."""
        fallback = self.for_device(tensor.device.type)
        fallback.record(tensor, stream, poll=fallback.api.sanitized())

    def held(self) -> int:
        return sum(f.held() for f in self._by_type.values())

    def reclaim(self) -> int:
        return sum(f.reclaim() for f in self._by_type.values())

    def wait_all(self) -> None:
        for f in self._by_type.values():
            f.wait_all()


FALLBACK = _PerDevice()
