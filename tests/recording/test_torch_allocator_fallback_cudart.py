"""The torch-allocator fallback's raw-event path (``_holds.CudaRuntime``: events
made, recorded and queried through the CUDA runtime from C, a poll without
the GIL) against a stand-in libcudart (tests/helpers/fake_cudart) whose streams run
when the test says so.  The rules are test_torch_allocator_fallback.py's: one live
event per (storage, stream), reclaiming what completed, capture, resize_(0),
fork; plus the runtime's own: every status checked, a not-ready or failed
call leaves no error behind for torch, events on the stream's device.  On a
GPU, tests/recording/test_gpu_record_use.py runs the same class over torch's libcudart."""
import gc
import os
import threading
import time

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from helpers import fake_cudart
from helpers.fake_cudart import (CREATED, DESTROYED, FAIL_CREATE, FAIL_QUERY, FAIL_RECORD, INVALID_HANDLE, QUERIES,
                         RECORDS, SET_DEVICE, SYNCS, VIOLATIONS)
from conftest import wait_for
from helpers.fallback_doubles import DeviceAPIDouble, record_from_threads
from npu_lifetime.recording import _holds_py, torch_allocator_fallback
from npu_lifetime.recording.torch_allocator_fallback import CaptureGate, CudaAPI, NativeFallback, NpuAPI

_holds = pytest.importorskip("npu_lifetime.recording._holds", reason="the raw-event path is the extension's")
FAKE = fake_cudart.FakeCudart()


@pytest.fixture(autouse=True)
def fake():
    FAKE.reset()
    yield FAKE
    FAKE.reset()


class RawStream:
    """A stream of the fake runtime: ``handle`` is its cudaStream_t."""

    def __init__(self, handle: int, device: int = 0) -> None:
        self.handle, self.device_index = handle, device
        FAKE.stream_device(handle, device)


class RawAPI(DeviceAPIDouble):
    """A device API whose events go through the fake runtime: its Python
    event callables must never be called."""

    def __init__(self) -> None:
        super().__init__()
        self.is_capturing_calls = 0

    @staticmethod
    def runtime():
        return _holds.CudaRuntime(FAKE.path)

    def query(self, event):
        raise AssertionError("a Python query with a runtime")

    def new_event(self):
        raise AssertionError("a Python event with a runtime")

    def record_event(self, event, stream):
        raise AssertionError("a Python record with a runtime")

    def is_capturing(self) -> bool:
        self.is_capturing_calls += 1
        return super().is_capturing()


@pytest.fixture
def api():
    return RawAPI()


@pytest.fixture
def gate():
    return CaptureGate()


@pytest.fixture
def fallback(api, gate):
    """Polled by hand: no reaper thread."""
    fb = NativeFallback(api, gate=gate, background=False)
    assert fb._table.uses_runtime
    return fb


def graph_class_of(fake):
    class FakeGraph:  # like torch.cuda.CUDAGraph: its capture makes every query a violation
        def capture_begin(self):
            fake.capture_underway(True)

        def capture_end(self):
            fake.capture_underway(False)

    return FakeGraph


def test_events_are_made_recorded_and_queried_through_the_runtime(fake, fallback):
    side = RawStream(2)
    x = torch.ones(4)
    for _ in range(100):
        fallback.record(x, side)
    assert fallback.held() == 1 and fake.count(RECORDS) == 100 and fake.count(CREATED) == 1
    fake.run(side.handle, 99)  # the first 99 records have fired, the last has not
    assert fallback.reclaim() == 0 and fallback.held() == 1
    fake.run(side.handle)
    assert fallback.reclaim() == 1 and fallback.held() == 0
    assert fallback.counts["events_created"] == 1 and fake.count(VIOLATIONS) == 0
    assert fake.last_error() == 0  # the not-ready query left nothing for torch's next check


def test_fired_events_are_reused(fake, fallback):
    side = RawStream(2)
    for _ in range(5):
        fallback.record(torch.ones(4), side)
        fake.run(side.handle)
        assert fallback.reclaim() == 1
    assert fake.count(CREATED) == 1 and fake.count(RECORDS) == 5


@pytest.mark.parametrize("fired", [0, 10, 200])
def test_reclaiming_queries_the_log_of_what_completed_not_what_is_held(fake, fallback, fired):
    side, other = RawStream(2), RawStream(3)
    held = [torch.ones(1) for _ in range(200)]
    for t in held:
        fallback.record(t, side)
    fallback.record(torch.ones(1), other)
    queries = fake.count(QUERIES)
    assert fallback.reclaim() == 0 and fake.count(QUERIES) - queries == 2  # one head per stream
    fake.run(side.handle, fired)
    queries = fake.count(QUERIES)
    assert fallback.reclaim() == fired and fallback.held() == 200 - fired + 1
    assert fake.count(QUERIES) - queries <= 2 * (fired + 1).bit_length() - 1 + 1  # galloping, bisecting; other's head


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["record", "run", "reclaim"]), st.integers(0, 4), st.integers(0, 2)),
                max_size=40))
def test_released_exactly_when_the_latest_use_has_fired(ops):
    FAKE.reset()
    fallback = NativeFallback(RawAPI(), gate=CaptureGate(), background=False)
    streams = [RawStream(h + 1) for h in range(3)]
    tensors = [torch.ones(1) for _ in range(5)]
    latest = {}  # (tensor index, stream index) -> queue position of the latest record
    done = [0, 0, 0]
    for op, t, s in ops:
        if op == "record":
            fallback.record(tensors[t], streams[s])
            latest[(t, s)] = FAKE.queued(streams[s].handle)
        elif op == "run":
            FAKE.run(streams[s].handle, t)
            done[s] = FAKE.lib.fake_done(streams[s].handle)
        else:
            fallback.reclaim()
            assert fallback.held() == sum(1 for (_, s_), mark in latest.items() if done[s_] < mark)
    assert FAKE.count(VIOLATIONS) == 0


# -- capture ------------------------------------------------------------------------------------------

def test_a_use_stream_that_captures_degrades_to_record_stream(fake, api, fallback):
    side = RawStream(2)
    fake.capture(side.handle)  # e.g. joined into a capture by a wait on a capturing stream
    x = torch.ones(4)
    fallback.record(x, side)
    assert api.recorded_streams == [(x.untyped_storage().data_ptr(), side.handle)]
    assert fake.count(RECORDS) == 0 and fallback.held() == 0 and fallback.counts["in_capture"] == 1


def test_the_current_stream_is_asked_only_while_a_capture_is_underway(fake, api, gate, fallback):
    side = RawStream(2)
    api.capturing = True  # not asked: no capture through the graph classes
    fallback.record(torch.ones(4), side)
    assert api.is_capturing_calls == 0 and fallback.held() == 1
    graph_class = graph_class_of(fake)
    gate.watch(graph_class)
    graph = graph_class()
    graph.capture_begin()
    x = torch.ones(4)
    fallback.record(x, side)  # asked now: the calling thread captures, so it degrades
    graph.capture_end()
    assert api.is_capturing_calls == 1 and fallback.counts["in_capture"] == 1
    assert api.recorded_streams == [(x.untyped_storage().data_ptr(), side.handle)]
    assert fake.count(VIOLATIONS) == 0


def test_the_legacy_stream_while_another_captures_counts_as_capturing(fake, api, fallback):
    legacy, capturing = RawStream(0), RawStream(5)
    fake.capture(capturing.handle)
    fallback.record(torch.ones(4), legacy)  # a record there would join (and break) the capture
    assert fallback.counts["in_capture"] == 1 and fake.count(RECORDS) == 0
    assert fake.last_error() == 0  # the runtime's "implicit capture" answer was cleared


def test_no_query_while_a_capture_may_be_underway(fake, api, gate):
    graph_class = graph_class_of(fake)
    gate.watch(graph_class)
    fallback = NativeFallback(api, gate=gate)  # with its reaper
    side = RawStream(2)
    fallback.record(torch.ones(4), side)
    graph = graph_class()
    graph.capture_begin()
    fake.run(side.handle)
    time.sleep(0.2)  # the reaper wakes up many times meanwhile
    assert fallback.reclaim() == 0 and fallback.held() == 1
    assert fake.count(VIOLATIONS) == 0 and fallback.counts["polls_skipped_for_capture"] >= 2
    graph.capture_end()
    assert wait_for(lambda: fallback.held() == 0) and fake.count(VIOLATIONS) == 0
    fallback.stop_background()


def test_the_reaper_skips_a_stream_that_captures(fake, api):
    fallback = NativeFallback(api, gate=CaptureGate())
    side, other = RawStream(2), RawStream(3)
    fallback.record(torch.ones(4), side)
    fallback.record(torch.ones(4), other)
    fake.capture(side.handle)  # captured below torch's graph classes: the runtime still says so
    fake.run(side.handle)
    fake.run(other.handle)
    assert wait_for(lambda: fallback.held() == 1)  # other's entry went, side's stays
    time.sleep(0.05)
    assert fallback.held() == 1 and fake.count(VIOLATIONS) == 0
    assert fallback.counts["capturing_streams_skipped"] >= 1
    fake.capture(side.handle, False)
    assert wait_for(lambda: fallback.held() == 0) and fake.count(VIOLATIONS) == 0
    fallback.stop_background()


def test_a_poll_releases_the_gil_while_it_queries(fake, fallback):
    side = RawStream(2)
    fallback.record(torch.ones(4), side)
    fake.query_sleep(0.3)
    ticks, stop = [], threading.Event()

    def tick():  # Python code: it runs only while no other thread holds the GIL
        while not stop.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.001)

    t = threading.Thread(target=tick)
    t.start()
    time.sleep(0.02)
    start = time.perf_counter()
    fallback.reclaim()  # 0.3 s inside the query
    end = time.perf_counter()
    stop.set()
    t.join()
    during = [s for s in ticks if start <= s <= end]
    assert end - start >= 0.3 and len(during) >= 50, (end - start, len(during))


# -- resize_(0), wait_all, the observer ------------------------------------------------------------------

def test_resize_to_zero_keeps_the_memory_for_pending_streams(fake, api, fallback):
    side, done = RawStream(2), RawStream(3)
    x = torch.ones(256)
    address = x.untyped_storage().data_ptr()
    fallback.record(x, side)
    fallback.record(x, done)
    fake.run(done.handle)
    x.untyped_storage().resize_(0)
    assert api.recorded_streams == [(address, side.handle)]  # only the stream still pending
    assert fallback.counts["kept_across_resize"] == 1 and fake.count(VIOLATIONS) == 0


def test_resize_keeps_a_capturing_stream_without_a_query(fake, api, fallback):
    side = RawStream(2)
    x = torch.ones(256)
    fallback.record(x, side)
    fake.run(side.handle)
    fake.capture(side.handle)  # fired, but its stream captures now: no query
    x.untyped_storage().resize_(0)
    assert [h for _, h in api.recorded_streams] == [side.handle] and fake.count(VIOLATIONS) == 0


def test_wait_all_waits_for_every_raw_event(fake, fallback):
    side, other = RawStream(2), RawStream(3)
    fallback.record(torch.ones(4), side)
    fallback.record(torch.ones(4), other)
    fallback.wait_all()
    assert fake.count(SYNCS) == 2 and fallback.held() == 0


def test_the_out_of_memory_observer_releases_what_fired(fake, api, fallback):
    side = RawStream(2)
    fallback.record(torch.ones(4), side)
    [observer] = api.oom_observers
    fake.run(side.handle)
    observer(0, 1 << 30, 0, 0)
    assert fallback.held() == 0


# -- the runtime's statuses --------------------------------------------------------------------------

def test_a_failed_record_raises_and_leaves_nothing_held(fake, fallback):
    side = RawStream(2)
    fake.fail(FAIL_RECORD, 700)
    x = torch.ones(4)
    with pytest.raises(RuntimeError, match="cudaEventRecord failed with CUDA error 700"):
        fallback.record(x, side)
    assert fallback.held() == 0 and not fallback.guards(x.untyped_storage())
    assert fake.last_error() == 0  # raised here, not left for torch's next check
    fake.fail(FAIL_RECORD, 0)
    fallback.record(x, side)  # the event went back to the pool
    assert fallback.held() == 1 and fake.count(CREATED) == 1


def test_a_failed_record_of_a_held_storage_keeps_its_earlier_entry(fake, fallback):
    side = RawStream(2)
    x = torch.ones(4)
    fallback.record(x, side)
    fake.fail(FAIL_RECORD, 700)
    with pytest.raises(RuntimeError, match="700"):
        fallback.record(x, side)
    fake.fail(FAIL_RECORD, 0)
    assert fallback.held() == 1
    fake.run(side.handle)
    assert fallback.reclaim() == 1


def test_a_failed_event_creation_raises_and_holds_nothing(fake, fallback):
    fake.fail(FAIL_CREATE, 2)
    with pytest.raises(RuntimeError, match="cudaEventCreateWithFlags failed with CUDA error 2"):
        fallback.record(torch.ones(4), RawStream(2))
    assert fallback.held() == 0 and fake.last_error() == 0


def test_a_query_error_is_raised_and_the_entry_kept(fake, fallback):
    side = RawStream(2)
    fallback.record(torch.ones(4), side)
    fake.run(side.handle)
    fake.fail(FAIL_QUERY, 999)
    with pytest.raises(RuntimeError, match="cudaEventQuery failed with CUDA error 999"):
        fallback.reclaim()
    assert fallback.held() == 1 and fake.last_error() == 0
    fake.fail(FAIL_QUERY, 0)
    assert fallback.reclaim() == 1


def test_events_are_made_and_recorded_on_the_streams_device(fake, fallback):
    """The fake refuses a record on another device than the stream's (as the
    legacy stream, handle 0, is the current device's): the table switches
    device for the creation and the record, then switches back."""
    on_3 = RawStream(4, device=3)
    fallback.record(torch.ones(4), on_3)
    assert fake.count(VIOLATIONS) == 0 and fake.count(RECORDS) == 1 and fallback.held() == 1
    assert fake.count(SET_DEVICE) == 4 and fake.current_device() == 0  # create: 3 and back; record: 3 and back
    fallback.record(torch.ones(4), RawStream(5, device=0))
    assert fake.count(SET_DEVICE) == 4  # already current: no switch


def test_a_record_the_runtime_refuses_is_reported(fake, fallback):
    moved = RawStream(7, device=1)
    fake.stream_device(7, 2)  # the runtime's stream is on another device than the one the stream object says
    with pytest.raises(RuntimeError, match=f"cudaEventRecord failed with CUDA error {INVALID_HANDLE}"):
        fallback.record(torch.ones(4), moved)
    assert fallback.held() == 0 and fake.last_error() == 0


def test_a_table_destroys_its_raw_events(fake, api):
    table = _holds.Table(record_event=api.record_event, query=api.query, new_event=api.new_event,
                         is_capturing=api.is_capturing, record_stream=api.record_stream, handle=api.handle,
                         device_index=api.device_index, first_use=lambda *args: False, on_first=lambda: None,
                         device_flag="is_cpu", stream_type=RawStream, tensor_type=torch.Tensor,
                         runtime=api.runtime())
    side = RawStream(2)
    table.record(torch.ones(4), side)
    table.record(torch.ones(4), side)
    fake.run(side.handle, 1)
    assert table.poll() == 1  # one event pooled, one held
    assert fake.count(CREATED) == 2 and fake.count(DESTROYED) == 0
    del table
    gc.collect()
    assert fake.count(DESTROYED) == 2


def test_a_forked_child_starts_empty(fake, api, fallback):
    side = RawStream(2)
    fallback.record(torch.ones(4), side)
    pid = os.fork()
    if pid == 0:
        try:
            fallback.record(torch.ones(4), RawStream(9))
            os._exit(0 if fallback.held() == 1 else 2)
        except BaseException:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and fallback.held() == 1


def test_threads_recording_while_the_reaper_polls_lose_nothing(fake, api):
    fallback = NativeFallback(api, gate=CaptureGate())
    streams = [RawStream(h) for h in (2, 3, 4)]
    tensors = [torch.ones(1) for _ in range(8)]

    def now_and_then_a_stream_runs(i: int) -> None:
        if i % 50 == 0:
            fake.run(streams[i % 3].handle)

    errors = record_from_threads(fallback, tensors, streams, after_call=now_and_then_a_stream_runs)
    assert errors == [] and fallback.counts["recorded"] == 4 * 300
    for s in streams:
        fake.run(s.handle)
    assert wait_for(lambda: fallback.held() == 0) and fake.count(VIOLATIONS) == 0
    assert fallback.counts["released"] >= len(tensors)  # the reaper released them
    fallback.stop_background()


def test_fast_records_a_tensor_of_the_device_on_a_stream_of_its_type(fake, api):
    api.device_type, api.stream_type = "cpu", lambda: RawStream
    fallback = NativeFallback(api, gate=CaptureGate(), background=False)
    side = RawStream(2, device=-1)  # a CPU tensor's get_device()
    x = torch.ones(4)
    assert fallback.fast("not a tensor", side) is False and fallback.fast(x, "not a stream") is False
    assert fallback.fast(x, side) is True and fallback.held() == 1 and fake.count(RECORDS) == 1


# -- finding the runtime -------------------------------------------------------------------------------

def test_cuda_runtime_takes_only_a_loaded_library_with_every_call(tmp_path):
    with pytest.raises(OSError, match="not loaded"):
        _holds.CudaRuntime(str(tmp_path / "libcudart.so.12"))
    with pytest.raises(OSError, match="has no cudaEventCreateWithFlags"):
        _holds.CudaRuntime(_holds.__file__)  # loaded, but not a CUDA runtime


def test_a_table_takes_a_runtime_or_none(api):
    common = dict(record_event=print, query=print, new_event=print, is_capturing=print, record_stream=print,
                  handle=print, device_index=print, first_use=print, on_first=print, device_flag="is_cpu",
                  stream_type=RawStream, tensor_type=torch.Tensor)
    with pytest.raises(TypeError, match="runtime"):
        _holds.Table(**common, runtime="libcudart")
    with pytest.raises(TypeError, match="runtime"):
        _holds_py.Table(**common, runtime=api.runtime())  # raw events need the extension
    assert not _holds.Table(**common).uses_runtime


def test_the_runtime_is_found_among_the_loaded_libraries(fake):
    name = os.path.basename(fake.path)
    assert fake.path in torch_allocator_fallback._loaded_libraries(name)


def test_without_a_cuda_build_or_on_npu_events_go_through_the_device_api(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    assert CudaAPI.runtime() is None
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setenv("NPU_LIFETIME_TORCH_EVENTS", "1")
    assert CudaAPI.runtime() is None
    assert NpuAPI.runtime() is None  # torch_npu's task queue orders its event records


def test_a_cuda_build_loads_the_runtime_from_torchs_library(monkeypatch, fake):
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.delenv("NPU_LIFETIME_TORCH_EVENTS", raising=False)
    monkeypatch.setattr(torch_allocator_fallback, "_loaded_libraries", lambda name: ["/not/loaded/" + name, fake.path])
    assert isinstance(CudaAPI.runtime(), _holds.CudaRuntime)
