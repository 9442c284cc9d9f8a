"""The torch-allocator fallback's logic against a fake device API whose streams run
when the test says so (the same class runs over torch.cuda in
test_gpu_record_use.py): no-op on the allocation stream, one live event per
(storage, stream), reclaiming that costs what completed, release without
another call (the reaper thread, the out-of-memory observer), no query while
a capture may be underway (the capture gate), capture, resize_(0), fork."""
import os
import sys
import threading
import time

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import wait_for
from helpers.fallback_doubles import DeviceAPIDouble, record_from_threads
from helpers.forking import child_exit_code
from npu_lifetime.recording import _holds_py, torch_allocator_fallback
from npu_lifetime.recording.torch_allocator_fallback import CaptureGate, NativeFallback

# every test runs over both tables, _holds.cpp's then _holds_py.py's (conftest.py)
pytestmark = pytest.mark.usefixtures("record_both_ways")


class FakeStream:
    def __init__(self, handle: int, device: int = 0) -> None:
        self.handle, self.device_index = handle, device
        self.queued = 0  # work items queued so far
        self.done = 0  # work items finished

    def run(self, n=None) -> None:
        self.done = self.queued if n is None else min(self.queued, self.done + n)


class FakeEvent:
    def __init__(self) -> None:
        self.stream, self.mark = None, None

    def record(self, stream: FakeStream) -> None:
        stream.queued += 1  # the event itself is a queued item
        self.stream, self.mark = stream, stream.queued

    def synchronize(self) -> None:
        self.stream.done = max(self.stream.done, self.mark)


class FakeAPI(DeviceAPIDouble):
    def __init__(self) -> None:
        super().__init__()
        self.capture_underway = False  # a capture elsewhere in the process (FakeGraph)
        self.violations = []  # queries made while a capture was underway
        self.queries = 0

    def query(self, event: FakeEvent) -> bool:
        if self.capturing or self.capture_underway or getattr(event.stream, "capturing", False):
            self.violations.append(event)  # the reaper thread swallows exceptions: keep a record
            raise AssertionError("queried an event during capture")
        self.queries += 1
        return event.stream.done >= event.mark

    @staticmethod
    def stream_capturing(stream) -> bool:
        return getattr(stream, "capturing", False)

    def new_event(self):
        return FakeEvent()


def segment_of(t: torch.Tensor, stream: FakeStream) -> dict:
    s = t.untyped_storage()
    return {"address": s.data_ptr(), "total_size": s.nbytes(), "device": stream.device_index, "stream": stream.handle}


@pytest.fixture
def api():
    return FakeAPI()


@pytest.fixture
def fallback(api):
    """Polled by hand: no reaper thread, a capture gate of its own."""
    return NativeFallback(api, gate=CaptureGate(), background=False)


def test_each_instance_holds_in_its_own_table(fallback, record_both_ways):
    """The switch reaches the fallback: _holds.cpp's Table, or _holds_py.py's."""
    in_cpp = type(fallback._table).__module__ == "npu_lifetime.recording._holds"
    assert in_cpp == (record_both_ways == "native")


def make_graph_class(api):
    """A graph class like torch.cuda.CUDAGraph, whose capture the fake API sees."""

    class FakeGraph:
        def capture_begin(self):
            api.capture_underway = True

        def capture_end(self):
            api.capture_underway = False

    return FakeGraph


def test_a_use_on_the_allocation_stream_is_a_no_op(api, fallback):
    owner, side = FakeStream(1), FakeStream(2)
    x = torch.ones(64)
    api.segment_list = [segment_of(x, owner)]
    fallback.record(x, owner)
    assert fallback.held() == 0 and fallback.counts["on_allocation_stream"] == 1
    fallback.record(x[10:], side)  # a view, another stream: held
    assert fallback.held() == 1


def test_a_stale_segment_table_is_rebuilt_before_skipping(api, fallback):
    owner, side = FakeStream(1), FakeStream(2)
    x = torch.ones(64)
    api.segment_list = [segment_of(x, owner)]
    fallback.record(x, owner)
    assert fallback.held() == 0
    # the allocator released that segment and the range came back for `side`
    api.segment_list, api.version = [segment_of(x, side)], (1, 1)
    fallback.record(x, owner)
    assert fallback.held() == 1, "skipped on a stream that no longer owns the memory"
    assert fallback.segments.rebuilds == 2
    fallback.record(x, side)
    assert fallback.segments.rebuilds == 2  # unchanged allocator: no new snapshot


def test_when_the_allocator_cannot_say_the_call_records(api, fallback):
    def broken():
        raise RuntimeError("no snapshots here")

    api.segments = broken
    owner = FakeStream(1)
    fallback.record(torch.ones(4), owner)
    assert fallback.held() == 1


def test_one_live_event_per_storage_and_stream(api, fallback):
    side = FakeStream(2)
    x = torch.ones(4)
    for _ in range(100):
        fallback.record(x, side)
    assert fallback.held() == 1 and fallback.counts["events_created"] == 1
    side.run(99)  # the first 99 records have fired, the last has not
    assert fallback.reclaim() == 0 and fallback.held() == 1
    side.run()
    assert fallback.reclaim() == 1 and fallback.held() == 0


def test_a_re_recorded_entry_moves_behind_later_ones(api, fallback):
    side = FakeStream(2)
    a, b = torch.ones(4), torch.ones(4)
    fallback.record(a, side)
    fallback.record(b, side)
    fallback.record(a, side)  # a's event is now the latest on the stream
    side.run(2)  # a's first record and b's have fired
    assert fallback.reclaim() == 1 and fallback.held() == 1  # b released, a still held


def most_queries(fired: int) -> int:
    """A stream's queries in one poll that finds ``fired`` of its entries
    fired: galloping then bisecting over the fired prefix."""
    return 2 * (fired + 1).bit_length() - 1


def test_the_fired_prefix_search_finds_every_prefix_within_its_query_bound():
    """_holds_py.fired_prefix (the reference of _holds.cpp's) on every
    (size, fired) up to 70: the answer, the bound, and no entry asked twice."""
    for size in range(71):
        for fired in range(size + 1):
            asked = []
            found = _holds_py.fired_prefix(size, lambda i: asked.append(i) or i < fired)
            assert found == fired and len(asked) <= most_queries(fired), (size, fired, asked)
            assert len(set(asked)) == len(asked) and all(0 <= i < size for i in asked)


@pytest.mark.parametrize("fired", [0, 1, 10, 999, 1000])
def test_reclaiming_queries_the_log_of_what_completed_not_what_is_held(api, fallback, fired):
    side, other = FakeStream(2), FakeStream(3)
    held = [torch.ones(1) for _ in range(1000)]
    for t in held:
        fallback.record(t, side)
    fallback.record(torch.ones(1), other)
    api.queries = 0
    fallback.record(torch.ones(1), other)  # a call records and holds: it polls nothing
    assert api.queries == 0
    assert fallback.reclaim() == 0 and api.queries == 2  # nothing completed: one query per stream
    side.run(fired)
    api.queries = 0
    assert fallback.reclaim() == fired and fallback.held() == 1000 - fired + 2  # (+2: the two on other)
    assert api.queries <= most_queries(fired) + 1  # (+1: the head on other)
    # asking head after head (one query per fired entry) would cost fired + 2


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["record", "run", "reclaim"]), st.integers(0, 4), st.integers(0, 2)),
                max_size=40))
def test_released_exactly_when_the_latest_use_has_fired(ops):
    """Oracle: a storage is held while, for some stream, the latest
    record_use on it has not finished; the fallback must agree after every
    reclaim."""
    api = FakeAPI()
    fallback = NativeFallback(api, gate=CaptureGate(), background=False)
    streams = [FakeStream(h + 1) for h in range(3)]
    tensors = [torch.ones(1) for _ in range(5)]
    latest = {}  # (tensor index, stream) -> queue position of the latest record
    for op, t, s in ops:
        stream = streams[s]
        if op == "record":
            fallback.record(tensors[t], stream)
            latest[(t, s)] = stream.queued
        elif op == "run":
            stream.run(t)
        else:
            fallback.reclaim()
            expected = {k for k, mark in latest.items() if streams[k[1]].done < mark}
            assert fallback.held() == len(expected)


def test_during_capture_it_degrades_to_record_stream_and_queries_nothing(api, fallback):
    side = FakeStream(2)
    before = torch.ones(4)
    fallback.record(before, side)  # held from before the capture
    api.capturing = True
    x = torch.ones(4)
    fallback.record(x, side)  # FakeAPI.query raises if called now
    assert api.recorded_streams == [(x.untyped_storage().data_ptr(), side.handle)]
    assert fallback.reclaim() == 0 and fallback.held() == 1
    assert fallback.counts["in_capture"] == 1
    api.capturing = False
    side.run()
    assert fallback.reclaim() == 1


def test_resize_to_zero_keeps_the_memory_for_pending_streams(api, fallback):
    side, done = FakeStream(2), FakeStream(3)
    x = torch.ones(256)
    address = x.untyped_storage().data_ptr()
    fallback.record(x, side)
    fallback.record(x, done)
    done.run()
    x.untyped_storage().resize_(0)  # how FSDP frees a parameter
    assert api.recorded_streams == [(address, side.handle)]  # only the stream still pending
    assert fallback.counts["kept_across_resize"] == 1
    y = torch.ones(256)
    y.untyped_storage().resize_(0)  # a storage the fallback does not hold: untouched
    assert len(api.recorded_streams) == 1


def test_a_forked_child_starts_empty_and_never_deadlocks(api, fallback):
    side = FakeStream(2)
    fallback.record(torch.ones(4), side)
    holding = threading.Event()

    def busy():  # another thread inside the fallback when fork() happens
        with fallback._lock:
            holding.set()
            time.sleep(0.3)

    t = threading.Thread(target=busy)
    t.start()
    holding.wait()
    pid = os.fork()
    if pid == 0:  # the child: must be able to use the fallback at once
        try:
            fallback.record(torch.ones(4), FakeStream(9))
            os._exit(0 if fallback.held() == 1 else 2)
        except BaseException:
            os._exit(3)
    t.join()
    exit_code = child_exit_code(pid)
    assert exit_code == 0, f"the forked child exited with {exit_code} (None: deadlocked on the fallback's lock)"
    assert fallback.held() == 1  # the parent keeps its own


def test_a_use_on_another_stream_costs_no_allocator_query(api, fallback):
    owner, side = FakeStream(1), FakeStream(2)
    x = torch.ones(64)
    api.segment_list = [segment_of(x, owner)]
    fallback.record(x, owner)  # builds the table
    calls = []
    version = api.segment_version
    api.segment_version = lambda device: (calls.append(device), version(device))[1]
    for _ in range(10):
        fallback.record(x, side)
    assert calls == []  # the cached table says "not the allocation stream": no stats call


# -- release without another call -----------------------------------------------------------------

def test_a_storage_is_released_once_its_event_fired_without_another_call(api):
    fallback = NativeFallback(api, gate=CaptureGate())  # the product's way: a reaper thread
    side = FakeStream(2)
    x = torch.ones(256)
    fallback.record(x, side)
    del x
    time.sleep(0.05)
    assert fallback.held() == 1  # still queued on side: held
    side.run()  # the consumer finished; nobody calls record_use again
    assert wait_for(lambda: fallback.held() == 0), "the storage was not released without another call"
    assert fallback.counts["released_in_background"] == 1 and api.violations == []
    fallback.stop_background()


def test_the_reaper_backs_off_while_nothing_fires_and_sleeps_when_nothing_is_held(api):
    fallback = NativeFallback(api, gate=CaptureGate())
    side = FakeStream(2)
    fallback.record(torch.ones(4), side)
    time.sleep(0.5)
    polls = fallback.counts["polls"]
    assert 3 <= polls <= 60, polls  # 1 ms doubling to 64 ms: about a dozen in half a second
    side.run()
    assert wait_for(lambda: fallback.held() == 0)
    polls = fallback.counts["polls"]
    time.sleep(0.2)
    assert fallback.counts["polls"] == polls  # nothing held: asleep
    fallback.record(torch.ones(4), side)  # a first entry wakes it at once
    side.run()
    assert wait_for(lambda: fallback.held() == 0, timeout=0.5)
    fallback.stop_background()


def test_a_busy_program_does_not_make_the_reaper_poll_more_often_than_its_interval(api):
    """Each poll empties the table and the next call is a 'first entry'
    again: those wakes must not restart the polling (on an H100 they made
    34x the polls, and every call paid for the contention)."""
    fallback = NativeFallback(api, gate=CaptureGate())
    side = FakeStream(2)
    x = torch.ones(4)
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # the reaper gets the GIL as often as a device call would let it
    try:
        start = time.perf_counter()
        while time.perf_counter() - start < 0.3:
            fallback.record(x, side)  # a first entry again: a wake
            side.run()
            fallback.reclaim()  # the table empties, as a poll empties it when the device keeps up
        elapsed = time.perf_counter() - start
    finally:
        sys.setswitchinterval(old)
    polls = fallback.counts["polls"]
    assert fallback.counts["released"] > 1000  # the table emptied (and a call woke the reaper) that often
    assert polls <= elapsed / fallback._reaper.MIN_INTERVAL + 3, (polls, elapsed)
    fallback.stop_background()


def test_no_query_while_a_capture_may_be_underway_anywhere(api):
    gate = CaptureGate()
    graph_class = make_graph_class(api)
    gate.watch(graph_class)
    fallback = NativeFallback(api, gate=gate)
    side = FakeStream(2)
    fallback.record(torch.ones(4), side)
    graph = graph_class()
    graph.capture_begin()  # another part of the program captures; this thread's stream does not
    side.run()
    time.sleep(0.2)  # the reaper wakes up many times meanwhile
    assert fallback.reclaim() == 0  # a poll on demand waits too
    assert fallback.held() == 1 and api.violations == []
    assert fallback.counts["polls_skipped_for_capture"] >= 2
    graph.capture_end()
    assert wait_for(lambda: fallback.held() == 0)
    assert api.violations == []
    fallback.stop_background()


def test_a_capture_waits_for_a_poll_in_progress(api):
    gate = CaptureGate()
    graph_class = make_graph_class(api)
    gate.watch(graph_class)
    began = threading.Event()
    with gate.polling() as open_:
        assert open_
        t = threading.Thread(target=lambda: (graph_class().capture_begin(), began.set()))
        t.start()
        time.sleep(0.1)
        assert not began.is_set()  # capture_begin waits until the poll ends
    t.join(5)
    assert began.is_set() and gate.underway() == 1
    with gate.polling() as open_:
        assert not open_


def test_the_reaper_skips_a_stream_that_captures(api):
    fallback = NativeFallback(api, gate=CaptureGate())
    side, other = FakeStream(2), FakeStream(3)
    fallback.record(torch.ones(4), side)
    fallback.record(torch.ones(4), other)
    side.capturing = True  # captured below torch's graph classes: the runtime still says so
    side.run()
    other.run()
    assert wait_for(lambda: fallback.held() == 1)  # other's entry went, side's stays
    time.sleep(0.1)
    assert fallback.held() == 1 and api.violations == []
    side.capturing = False
    assert wait_for(lambda: fallback.held() == 0)
    fallback.stop_background()


def test_the_out_of_memory_observer_releases_what_fired(api, fallback):
    side = FakeStream(2)
    fallback.record(torch.ones(4), side)
    [observer] = api.oom_observers  # attached at the first entry
    side.run()
    observer(0, 1 << 30, 0, 0)  # what torch calls before it raises OutOfMemoryError
    assert fallback.held() == 0 and fallback.counts["out_of_memory_polls"] == 1


def test_resize_while_a_capture_may_be_underway_keeps_every_stream_without_a_query(api):
    gate = CaptureGate()
    graph_class = make_graph_class(api)
    gate.watch(graph_class)
    fallback = NativeFallback(api, gate=gate, background=False)
    side, done = FakeStream(2), FakeStream(3)
    x = torch.ones(256)
    fallback.record(x, side)
    fallback.record(x, done)
    done.run()
    graph = graph_class()
    graph.capture_begin()
    x.untyped_storage().resize_(0)
    graph.capture_end()
    assert sorted(h for _, h in api.recorded_streams) == [side.handle, done.handle]  # no query: both kept
    assert api.violations == []


def test_fork_while_the_reaper_polls_leaves_the_child_free_to_poll(api):
    gate = CaptureGate()
    fallback = NativeFallback(api, gate=gate)
    side = FakeStream(2)
    fallback.record(torch.ones(4), side)  # never fires: the reaper keeps polling
    for _ in range(5):
        time.sleep(0.01)
        pid = os.fork()
        if pid == 0:  # whatever the reaper held at fork() time, the child gets it free
            try:
                child_side = FakeStream(9)
                fallback.record(torch.ones(4), child_side)
                ok = fallback.held() == 1  # its own entry; not the parent's
                child_side.run()
                fallback.reclaim()  # (or the child's own reaper)
                ok = ok and wait_for(lambda: fallback.held() == 0, timeout=2)
                with gate.polling() as open_:
                    ok = ok and open_
                os._exit(0 if ok else 2)
            except BaseException:
                os._exit(3)
        exit_code = child_exit_code(pid)
        assert exit_code == 0, f"the forked child exited with {exit_code} (None: deadlocked)"
    assert fallback.held() == 1
    fallback.stop_background()


# -- the table's own edges ---------------------------------------------------------------------------

def test_an_event_record_that_fails_leaves_nothing_held(api, fallback):
    """A record that raised recorded nothing: no entry may hold the storage
    on an event that will never fire for it."""
    side = FakeStream(2)
    kept, x = torch.ones(4), torch.ones(4)
    fallback.record(kept, side)

    def failing(event, stream):
        raise RuntimeError("device error")

    fallback._table = torch_allocator_fallback.Table(  # the same table, its record_event failing
        record_event=failing, query=api.query, new_event=api.new_event, is_capturing=api.is_capturing,
        record_stream=api.record_stream, handle=api.handle, device_index=api.device_index,
        first_use=fallback._first_use, on_first=lambda: None, device_flag="is_cpu",
        stream_type=FakeStream, tensor_type=torch.Tensor)
    with pytest.raises(RuntimeError, match="device error"):
        fallback.record(x, side)
    assert fallback.held() == 0 and fallback.counts["recorded"] == 0
    assert not fallback.guards(x.untyped_storage())


def test_a_failed_record_of_a_held_storage_keeps_its_earlier_entry(api, fallback):
    side = FakeStream(2)
    x = torch.ones(4)
    fallback.record(x, side)
    api.new_event = None  # not needed: the entry exists
    original = FakeEvent.record

    def failing(self, stream):
        raise RuntimeError("device error")

    FakeEvent.record = failing
    try:
        with pytest.raises(RuntimeError, match="device error"):
            fallback.record(x, side)
    finally:
        FakeEvent.record = original
    assert fallback.held() == 1  # the earlier record still holds it
    side.run()
    assert fallback.reclaim() == 1


def test_fast_takes_only_a_tensor_of_the_device_and_a_stream_of_its_type(api):
    """The fast path's checks: anything else is False (nothing done), so
    the checked path can say what was wrong."""
    api.device_type, api.stream_type = "cpu", lambda: FakeStream
    fallback = NativeFallback(api, gate=CaptureGate(), background=False)
    side = FakeStream(2, device=-1)  # a CPU tensor's get_device()
    x = torch.ones(4)
    freed = torch.ones(4)
    freed.untyped_storage().resize_(0)
    for tensor, stream in [("not a tensor", side), (x, "not a stream"), (x, None), (x, FakeStream(2, device=0)),
                           (torch.ones(4, device="meta"), side), (freed, side)]:
        assert fallback.fast(tensor, stream) is False
    assert fallback.held() == 0 and fallback.counts["recorded"] == 0
    assert fallback.fast(x, side) is True and fallback.held() == 1


def test_a_table_refuses_what_is_not_callable(api):
    with pytest.raises(TypeError, match="query"):
        torch_allocator_fallback.Table(
            record_event=print, query=None, new_event=print, is_capturing=print, record_stream=print, handle=print,
            device_index=print, first_use=print, on_first=print, device_flag="is_cpu", stream_type=FakeStream,
            tensor_type=torch.Tensor)


def test_record_refuses_what_is_not_a_tensor(fallback):
    with pytest.raises(AttributeError, match="untyped_storage"):
        fallback.record("not a tensor", FakeStream(2))
    assert fallback.held() == 0


def test_threads_recording_while_the_reaper_polls_lose_nothing(api):
    """Threads record (their device calls are Python, so the GIL switches
    inside a call holding the table's lock) while the reaper polls; once
    every stream ran, everything is released and every entry was counted."""
    fallback = NativeFallback(api, gate=CaptureGate())
    streams = [FakeStream(h) for h in (2, 3, 4)]
    tensors = [torch.ones(1) for _ in range(8)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # the GIL changes hands inside the calls
    try:
        errors = record_from_threads(fallback, tensors, streams)
    finally:
        sys.setswitchinterval(interval)
    assert errors == [] and fallback.counts["recorded"] == 4 * 300
    assert 1 <= fallback.held() <= len(tensors) * len(streams)
    for s in streams:
        s.run()
    assert wait_for(lambda: fallback.held() == 0) and api.violations == []
    fallback.stop_background()


def test_an_allocator_without_oom_observers_is_no_error(monkeypatch):
    """torch's cudaMallocAsync backend refuses out-of-memory observers
    (RuntimeError: "cudaMallocAsync does not yet support
    attachOutOfMemoryObserver", seen on the H200 from record_use): the
    fallback then relies on its reaper's polls alone."""
    import torch

    from npu_lifetime.recording.torch_allocator_fallback import CudaAPI

    def refuse(observer):
        raise RuntimeError("cudaMallocAsync does not yet support attachOutOfMemoryObserver")

    monkeypatch.setattr(torch._C, "_cuda_attach_out_of_memory_observer", refuse, raising=False)
    CudaAPI.attach_oom_observer(lambda *args: None)  # no error
