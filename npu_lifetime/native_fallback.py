"""record_use under a native caching allocator (no shim): an event on the
use stream plus an owned reference to the storage, released once the event
has fired.

Invariants:

* **No-op on the allocation stream.**  The caching allocators carve every
  block out of a segment that belongs to one stream, the stream current at
  allocation; the segment table comes from the allocator's own snapshot
  (``memory_snapshot()``), cached, and rebuilt when a pointer falls outside
  it.  A cached answer is trusted for skipping only while the allocator's
  segment counters (``num_device_alloc``/``num_device_free``) are
  unchanged: a freed segment's range may come back for another stream.
  When the table cannot tell, the call records (never wrong, only slower).
* **One live event per (storage, stream)**, kept in a per-stream FIFO
  ordered by record time: a repeated call re-records its event and moves it
  to the tail.  Events on one stream complete in order, so reclaiming looks
  at the oldest entry of each stream and stops at the first unfired one:
  the work per call is the number of streams with entries plus what
  completed, not what is held.
* **Capture.**  While the calling stream captures a CUDA graph the call
  degrades to ``record_stream`` (the allocator itself defers events during
  capture) and nothing is recorded or queried: an event recorded during a
  capture must never be queried.  Only events recorded outside captures are
  ever held, and they are polled only by calls whose stream is not
  capturing (there is no background thread: nothing in Python tells a
  thread that another thread began a capture).
* **``resize_(0)``** (how FSDP frees parameters) returns a storage's memory
  while the storage object lives on, so an owned reference alone does not
  hold it.  While a storage has pending entries, ``UntypedStorage.resize_``
  to a smaller size first ``record_stream``s each pending stream, so the
  allocator keeps the memory until that stream's work at the resize is done.
* **Fork.**  The lock is held across ``fork()``; the child starts empty and
  never touches the parent's events or storages (its CUDA context is gone).
"""
from __future__ import annotations

import bisect
import functools
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Optional

import torch


@dataclass
class _Held:
    event: object
    storage: torch.UntypedStorage
    device: int


class NativeFallback:
    """The fallback for one device API (``CudaAPI``, ``NpuAPI``, or a fake
    in tests).  Thread-safe."""

    def __init__(self, api) -> None:
        self.api = api
        self.segments = SegmentTable(api)
        self._lock = threading.Lock()
        self._fifos: dict = {}  # stream handle -> OrderedDict(storage key -> _Held)
        self._streams_of: dict = {}  # storage key -> {stream handle: typed stream}
        self._idle_events: dict = {}  # device index -> events that have fired
        self._orphans: list = []  # what a forked child inherited and must never touch
        self.counts = dict.fromkeys(
            ("recorded", "events_created", "queries", "released", "on_allocation_stream", "in_capture",
             "kept_across_resize"), 0)
        os.register_at_fork(before=self._lock.acquire, after_in_parent=self._lock.release,
                            after_in_child=self._after_fork_in_child)

    # -- the call ----------------------------------------------------------------------
    def record(self, tensor: torch.Tensor, stream) -> None:
        api = self.api
        if api.is_capturing():
            api.record_stream(tensor, stream)
            self.counts["in_capture"] += 1
            return
        handle = api.handle(stream)
        storage = tensor.untyped_storage()
        device = api.device_index(stream)
        if self.segments.is_allocation_stream(storage.data_ptr(), device, handle):
            self.counts["on_allocation_stream"] += 1
            return
        _guard_resize(self)
        with self._lock:
            released = self._reclaim_locked()
            key = storage._cdata
            fifo = self._fifos.setdefault(handle, OrderedDict())
            held = fifo.get(key)
            if held is None:
                held = fifo[key] = _Held(self._event_locked(device), storage, device)
                self._streams_of.setdefault(key, {})[handle] = stream
            else:
                fifo.move_to_end(key)
            held.event.record(stream)
            self.counts["recorded"] += 1
        del released  # storages may die here, outside the lock

    # -- reclaiming ---------------------------------------------------------------------------
    def reclaim(self) -> int:
        """Releases what has fired; returns how many entries.  Does nothing
        while the calling stream captures."""
        if self.api.is_capturing():
            return 0
        with self._lock:
            released = self._reclaim_locked()
        return len(released)

    def wait_all(self) -> None:
        """Blocks until every held event has fired, then releases them."""
        with self._lock:
            events = [held.event for fifo in self._fifos.values() for held in fifo.values()]
        for event in events:
            event.synchronize()
        self.reclaim()

    def held(self) -> int:
        with self._lock:
            return sum(len(fifo) for fifo in self._fifos.values())

    def _reclaim_locked(self) -> list:
        released = []
        for handle in list(self._fifos):
            fifo = self._fifos[handle]
            while fifo:
                key, held = next(iter(fifo.items()))
                self.counts["queries"] += 1
                if not self.api.query(held.event):
                    break  # later entries on this stream were recorded after it
                fifo.popitem(last=False)
                released.append(held.storage)
                self._idle_events.setdefault(held.device, []).append(held.event)
                streams = self._streams_of[key]
                del streams[handle]
                if not streams:
                    del self._streams_of[key]
            if not fifo:
                del self._fifos[handle]
        self.counts["released"] += len(released)
        return released

    def _event_locked(self, device: int):
        idle = self._idle_events.get(device)
        if idle:
            return idle.pop()
        self.counts["events_created"] += 1
        return self.api.new_event()

    # -- resize_ ------------------------------------------------------------------------------------
    def before_shrink(self, storage: torch.UntypedStorage) -> None:
        """``storage`` is about to give back memory: keep it for every
        pending stream (the allocator records an event there at the free)."""
        with self._lock:
            streams = dict(self._streams_of.get(storage._cdata, {}))
            pending = [s for h, s in streams.items() if not self.api.query(self._fifos[h][storage._cdata].event)]
        if pending:
            alias = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
            for stream in pending:
                self.api.record_stream(alias, stream)
            self.counts["kept_across_resize"] += len(pending)

    def guards(self, storage) -> bool:
        return storage._cdata in self._streams_of

    # -- fork -----------------------------------------------------------------------------------
    def _after_fork_in_child(self) -> None:
        self._orphans.append((self._fifos, self._idle_events))
        self._lock = threading.Lock()
        self._fifos, self._streams_of, self._idle_events = {}, {}, {}
        self.segments = SegmentTable(self.api)


class SegmentTable:
    """Which stream each of the allocator's segments belongs to (every block
    of a segment is allocated on that stream)."""

    def __init__(self, api) -> None:
        self.api = api
        self._starts: list = []  # sorted segment addresses
        self._segments: list = []  # (address, end, device, stream) in the same order
        self._version = None
        self.rebuilds = 0

    def is_allocation_stream(self, ptr: int, device: int, stream: int) -> bool:
        """Whether ``stream`` allocated the block holding ``ptr``.  A "no"
        from the cached table costs a bisect (recording when it is stale is
        only slower); a "yes" or a miss is checked against the allocator's
        segment counters first, and the table rebuilt if they moved."""
        try:
            if self._find(ptr, device) not in (None, stream):
                return False
            version = self.api.segment_version(device)
            if version != self._version:
                self._rebuild(version)
            return self._find(ptr, device) == stream
        except Exception:  # an allocator without snapshots or counters: record, never skip
            return False

    def _find(self, ptr: int, device: int) -> Optional[int]:
        i = bisect.bisect_right(self._starts, ptr) - 1
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
def _internal_query(event) -> bool:
    """The event's query, made as an internal poller: a sanitizer does not
    count our own polling as a host synchronisation the program could rely on."""
    from .sanitizer.watchers import internal_polling

    with internal_polling():
        return event.query()


class CudaAPI:
    def __init__(self) -> None:
        self.query = _internal_query

    def new_event(self):
        return torch.cuda.Event()

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
    def record_stream(tensor, stream) -> None:
        tensor.record_stream(stream)

    @staticmethod
    def segments() -> list:
        return torch.cuda.memory_snapshot(include_traces=False)

    @staticmethod
    def segment_version(device: int) -> tuple:
        stats = torch.cuda.memory_stats_as_nested_dict(device)
        return stats["num_device_alloc"], stats["num_device_free"]


class NpuAPI(CudaAPI):
    """torch_npu's counterparts (written against its published API; not run
    on an NPU here)."""

    def __init__(self) -> None:
        import torch_npu

        self._npu = torch_npu.npu
        self.query = _internal_query

    def new_event(self):
        return self._npu.Event()

    @staticmethod
    def handle(stream) -> int:
        return int(stream.npu_stream)

    def is_capturing(self) -> bool:
        return self._npu.is_current_stream_capturing()

    def segments(self) -> list:
        return self._npu.memory_snapshot()

    def segment_version(self, device: int) -> tuple:
        stats = self._npu.memory_stats(device)
        return stats["num_device_alloc"], stats["num_device_free"]


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
        self.for_device(tensor.device.type).record(tensor, stream)

    def held(self) -> int:
        return sum(f.held() for f in self._by_type.values())

    def reclaim(self) -> int:
        return sum(f.reclaim() for f in self._by_type.values())

    def wait_all(self) -> None:
        for f in self._by_type.values():
            f.wait_all()


FALLBACK = _PerDevice()
