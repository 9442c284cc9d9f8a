"""The torch-allocator fallback's table of held storages in Python: the same class as
``_holds.Table`` (``_holds.cpp``), used where that extension is not built.
See _holds.cpp for what it keeps; both take the device API as callables.
Only the extension takes a ``CudaRuntime`` (raw CUDA events): here events
always go through the callables."""
from __future__ import annotations

import threading
from bisect import bisect_right
from collections import OrderedDict
from itertools import islice

_COUNTS = ("recorded", "events_created", "queries", "released", "on_allocation_stream", "in_capture",
           "capturing_streams_skipped")


def fired_prefix(size: int, fired) -> int:
    """How many of a stream's ``size`` oldest entries have fired, asking
    ``fired(i)`` O(log answer) times: events on one stream fire in record
    order, so the fired entries are a prefix (galloping over the 1st, 2nd,
    4th, ... entry until one has not fired, then bisecting).  _holds.cpp's
    fired_prefix is the same search."""
    known, bound, span, galloping = 0, size, 1, True  # [0, known) fired; entry `bound` (if any) has not
    while known < bound:
        span = min(span, bound - known) if galloping else (bound - known + 1) // 2
        if fired(known + span - 1):
            known += span
            span *= 2 if galloping else 1
        else:
            bound, galloping = known + span - 1, False
    return known


class Table:
    takes_runtime = False  # NativeFallback passes runtime=None
    uses_runtime = False

    def __init__(self, record_event, query, new_event, is_capturing, record_stream, handle, device_index,
                 first_use, on_first, device_flag: str, stream_type: type, tensor_type: type,
                 runtime=None, captures_underway=None) -> None:
        if runtime is not None:
            raise TypeError("Table: runtime must be None here (raw events need the _holds extension)")
        for name, value in (("record_event", record_event), ("query", query), ("new_event", new_event),
                            ("is_capturing", is_capturing), ("record_stream", record_stream), ("handle", handle),
                            ("device_index", device_index), ("first_use", first_use), ("on_first", on_first)):
            if not callable(value):
                raise TypeError(f"Table: {name} must be callable")
        self._record_event, self._query, self._new_event = record_event, query, new_event
        self._is_capturing, self._record_stream = is_capturing, record_stream
        self._handle, self._device_index = handle, device_index
        self._first_use, self._on_first = first_use, on_first
        self._device_flag, self._stream_type, self._tensor_type = device_flag, stream_type, tensor_type
        self._lock = threading.Lock()
        self._fifos: dict = {}  # stream handle -> OrderedDict(storage -> event), in record order
        self._stream_of: dict = {}  # stream handle -> (typed stream, device index)
        self._idle_events: dict = {}  # device index -> fired events
        self._counts = dict.fromkeys(_COUNTS, 0)
        self._segments: list = []  # (start, end, device, owner) sorted by start
        self._starts: list = []

    def set_segments(self, rows) -> None:
        segments = sorted((int(a), int(b), int(d), int(o)) for a, b, d, o in rows)
        self._segments, self._starts = segments, [s[0] for s in segments]

    def _another_streams_memory(self, ptr: int, device: int, handle: int) -> bool:
        i = bisect_right(self._starts, ptr) - 1
        if i < 0:
            return False
        _, end, seg_device, owner = self._segments[i]
        return ptr < end and seg_device == device and owner != handle

    @property
    def counts(self) -> dict:
        return dict(self._counts)

    def fast(self, tensor, stream) -> bool:
        if not isinstance(tensor, self._tensor_type) or type(stream) is not self._stream_type:
            return False
        if getattr(tensor, self._device_flag) is not True or stream.device_index != tensor.get_device():
            return False
        return self.record(tensor, stream)

    def record(self, tensor, stream, storage=None) -> bool:
        if storage is None:
            storage = tensor.untyped_storage()
        ptr = storage.data_ptr()
        if not ptr:
            return False
        if self._is_capturing():
            self._record_stream(tensor, stream)
            self._counts["in_capture"] += 1
            return True
        handle = self._handle(stream)
        fifo = self._fifos.get(handle)
        device = None
        if fifo is None or storage not in fifo:  # its first call on this stream
            device = self._device_index(stream)
            if not self._another_streams_memory(ptr, device, handle) and self._first_use(storage, ptr, device, handle):
                self._counts["on_allocation_stream"] += 1
                return True
        with self._lock:
            first = not self._fifos
            fifo = self._fifos.get(handle)
            if fifo is None:
                fifo = self._fifos[handle] = OrderedDict()
                self._stream_of[handle] = (stream, self._device_index(stream) if device is None else device)
            event = fifo.get(storage)
            fresh = event is None
            if fresh:
                event = fifo[storage] = self._take_event(self._stream_of[handle][1])
            else:
                fifo.move_to_end(storage)
            try:
                self._record_event(event, stream)
            except BaseException:
                if fresh:  # nothing recorded: no entry
                    del fifo[storage]
                    if not fifo:
                        del self._fifos[handle], self._stream_of[handle]
                raise
            self._counts["recorded"] += 1
        if first:
            self._on_first()
        return True

    def _take_event(self, device: int):
        idle = self._idle_events.get(device)
        if idle:
            return idle.pop()
        self._counts["events_created"] += 1
        return self._new_event()

    def poll(self, stream_capturing=None) -> int:
        released = []
        with self._lock:
            for handle in list(self._fifos):
                fifo = self._fifos[handle]
                stream, device = self._stream_of[handle]
                if stream_capturing is not None and stream_capturing(stream):
                    continue
                for _ in range(fired_prefix(len(fifo), self._query_in_order(fifo))):
                    storage, event = fifo.popitem(last=False)
                    released.append(storage)
                    self._idle_events.setdefault(device, []).append(event)
                if not fifo:
                    del self._fifos[handle], self._stream_of[handle]
            self._counts["released"] += len(released)
        return len(released)  # the references go here, outside the lock

    def _query_in_order(self, fifo):
        """fired(i) over ``fifo``'s events, for fired_prefix: the events are
        taken in order as far as it asks (about twice what fired), not copied
        whole at each poll."""
        events, seen = iter(fifo.values()), []

        def fired(i: int) -> bool:
            seen.extend(islice(events, max(0, i + 1 - len(seen))))
            self._counts["queries"] += 1
            return self._query(seen[i])

        return fired

    def held(self) -> int:
        with self._lock:
            return sum(len(fifo) for fifo in self._fifos.values())

    def has_entries(self) -> bool:
        return bool(self._fifos)

    def pending_streams(self, storage, may_query: bool) -> list:
        with self._lock:
            held = [(self._stream_of[h][0], fifo[storage]) for h, fifo in self._fifos.items() if storage in fifo]
        return [stream for stream, event in held if not may_query or not self._query(event)]

    def guards(self, storage) -> bool:
        return any(storage in fifo for fifo in list(self._fifos.values()))

    def synchronize(self) -> None:
        with self._lock:
            events = [event for fifo in self._fifos.values() for event in fifo.values()]
        for event in events:
            event.synchronize()

    def acquire(self) -> None:
        self._lock.acquire()

    def release(self) -> None:
        self._lock.release()

    def __enter__(self):
        self._lock.acquire()

    def __exit__(self, *exc) -> None:
        self._lock.release()

    def reset_after_fork(self) -> None:
        self._orphans = (self._fifos, self._idle_events)  # the parent's: never touched
        self._lock = threading.Lock()
        self._fifos, self._stream_of, self._idle_events = {}, {}, {}
        self._segments, self._starts = [], []
