"""The native fallback's logic against a fake device API whose streams run
when the test says so (the same class runs over torch.cuda in
test_gpu_fallback.py): no-op on the allocation stream, one live event per
(storage, stream), reclaiming that costs what completed, capture, resize_(0),
fork."""
import os
import threading
import time

import pytest
import torch
from hypothesis import given, settings, strategies as st

from npu_lifetime.native_fallback import NativeFallback


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


class FakeAPI:
    def __init__(self) -> None:
        self.capturing = False
        self.queries = 0
        self.recorded_streams = []  # (tensor storage address, stream handle) passed to record_stream
        self.segment_list = []
        self.version = (0, 0)

    def query(self, event: FakeEvent) -> bool:
        if self.capturing:
            raise AssertionError("queried an event during capture")
        self.queries += 1
        return event.stream.done >= event.mark

    def new_event(self):
        return FakeEvent()

    @staticmethod
    def handle(stream) -> int:
        return stream.handle

    @staticmethod
    def device_index(stream) -> int:
        return stream.device_index

    def is_capturing(self) -> bool:
        return self.capturing

    def record_stream(self, tensor, stream) -> None:
        self.recorded_streams.append((tensor.untyped_storage().data_ptr(), stream.handle))

    def segments(self) -> list:
        return self.segment_list

    def segment_version(self, device: int):
        return self.version


def segment_of(t: torch.Tensor, stream: FakeStream) -> dict:
    s = t.untyped_storage()
    return {"address": s.data_ptr(), "total_size": s.nbytes(), "device": stream.device_index, "stream": stream.handle}


@pytest.fixture
def api():
    return FakeAPI()


@pytest.fixture
def fallback(api):
    return NativeFallback(api)


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


def test_reclaiming_costs_what_completed_not_what_is_held(api, fallback):
    side, other = FakeStream(2), FakeStream(3)
    held = [torch.ones(1) for _ in range(1000)]
    for t in held:
        fallback.record(t, side)
    fallback.record(torch.ones(1), other)
    api.queries = 0
    fallback.record(torch.ones(1), other)  # nothing completed: one query per stream
    assert api.queries == 2
    side.run(10)
    api.queries = 0
    assert fallback.reclaim() == 10
    assert api.queries == 10 + 1 + 1  # ten released, the first unfired on side, the one on other


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["record", "run", "reclaim"]), st.integers(0, 4), st.integers(0, 2)),
                max_size=40))
def test_released_exactly_when_the_latest_use_has_fired(ops):
    """Oracle: a storage is held while, for some stream, the latest
    record_use on it has not finished; the fallback must agree after every
    reclaim."""
    api = FakeAPI()
    fallback = NativeFallback(api)
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
    deadline = time.time() + 10
    while time.time() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child deadlocked on the fallback's lock")
    assert os.waitstatus_to_exitcode(status) == 0
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
