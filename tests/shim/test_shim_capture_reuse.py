"""graph_capture_record_stream_reuse under the shim (simulated runtime): a
block freed during a graph capture while other streams it was recorded on may
still use it is reused inside the capture once the capture's graph joins
those streams into the allocating stream, never before; with the setting off
such a free waits for the capture's end, as before.  The sim's captures build
a graph from stream order and event record/wait (test_shim_capture_topology.py).
torch's own tests (test_graph_capture_reclaim_*_streams) run on the GPU in
tests/shim/test_gpu_capture_reuse.py."""
import pytest
from conftest import S1, S2, S3

from helpers.shim_testing import check_invariants, sim_calls, sim_fail_next

S4 = 0x4000
POOL = (9, 0)
F8 = 32  # torch.empty(8) of float32


def begin(shim, stream=S1):
    shim.begin_allocate_to_pool(0, POOL, 0)  # every stream of the device allocates into the capture's pool
    shim.sim.set_capturing(stream, True)


def end(shim, stream=S1):
    shim.sim.set_capturing(stream, False)  # ends the capture for every stream in it
    shim.end_allocate_to_pool(0, POOL)


def wait_stream(shim, waiter, waited):
    """``waiter.wait_stream(waited)``: an event recorded on one, waited on by the other."""
    shim.sim.wait_event(waiter, shim.sim.record_event(waited))


def state_of(shim, ptr):
    [b] = [b for s in shim.snapshot()["segments"] for b in s["blocks"] if b["address"] == ptr]
    return b


def use_on(shim, stream, tensor):
    """A kernel on ``stream`` reading ``tensor``, recorded as torch's record_stream does."""
    shim.sim.launch(stream)
    shim.record_stream(tensor, stream)


def read_on_s2_in_a_capture(shim):
    """Begins a capture; x, allocated on S1 in it and read on S2 after S2 forked from S1."""
    begin(shim)
    x = shim.alloc(F8, 0, S1)
    wait_stream(shim, S2, S1)
    use_on(shim, S2, x)
    return x


@pytest.fixture
def reuse(sim_shim):
    sim_shim.set_graph_capture_record_stream_reuse(True)
    return sim_shim


def two_streams(shim):
    """torch's test_graph_capture_reclaim_2_streams: (data1, data2, data3)."""
    begin(shim)
    sink1 = shim.alloc(F8, 0, S1)
    data1 = shim.alloc(F8, 0, S1)
    wait_stream(shim, S2, S1)  # fork
    buf2 = shim.alloc(F8, 0, S2)
    use_on(shim, S2, data1)  # torch.add(data1, 2.0, out=buf2); data1.record_stream(s2)
    shim.free(data1, F8, 0, S1)
    check_invariants()
    data2 = shim.alloc(F8, 0, S1)  # before the join
    check_invariants()
    wait_stream(shim, S1, S2)  # join
    shim.sim.launch(S1)  # sink1.fill_(1.0)
    data3 = shim.alloc(F8, 0, S1)  # after the join
    check_invariants()
    end(shim)
    check_invariants()
    assert sink1 and buf2
    return data1, data2, data3


def test_two_streams_no_reuse_before_the_join_reuse_after(reuse):
    data1, data2, data3 = two_streams(reuse)
    assert data2 != data1
    assert data3 == data1


def test_four_streams_reuse_only_after_every_recorded_stream_joined(reuse):
    begin(reuse)
    data1 = reuse.alloc(F8, 0, S1)
    reuse.sim.launch(S1)  # torch.ones
    sink1, sink3 = reuse.alloc(F8, 0, S1), reuse.alloc(F8, 0, S1)
    for stream in (S2, S3, S4):
        wait_stream(reuse, stream, S1)
        reuse.alloc(F8, 0, stream)
        use_on(reuse, stream, data1)
    reuse.free(data1, F8, 0, S1)
    wait_stream(reuse, S1, S2)  # partial joins: s2 -> s1, s4 -> s3
    reuse.sim.launch(S1)
    wait_stream(reuse, S3, S4)
    use_on(reuse, S3, sink3)
    data2 = reuse.alloc(F8, 0, S1)
    assert data2 != data1
    assert state_of(reuse, data1)["state"] == "awaiting_join"
    check_invariants()
    wait_stream(reuse, S1, S3)  # the final join
    reuse.sim.launch(S1)
    data3 = reuse.alloc(F8, 0, S1)
    assert data3 == data1
    check_invariants()
    end(reuse)
    check_invariants()
    assert sink1


def test_one_recorded_stream_joined_of_two_is_not_enough(reuse):
    begin(reuse)
    x = reuse.alloc(F8, 0, S1)
    reuse.sim.launch(S1)
    for stream in (S2, S3):
        wait_stream(reuse, stream, S1)
        use_on(reuse, stream, x)
    reuse.free(x, F8, 0, S1)
    wait_stream(reuse, S1, S2)
    reuse.sim.launch(S1)
    assert reuse.alloc(F8, 0, S1) != x  # S3's use is not ordered before S1's next work
    wait_stream(reuse, S1, S3)
    assert reuse.alloc(F8, 0, S1) == x  # the join needs no kernel after it
    end(reuse)
    check_invariants()


def test_with_the_setting_off_the_free_waits_for_the_capture_end(sim_shim):
    assert not sim_shim.graph_capture_record_stream_reuse()  # off by default, as torch's
    data1, data2, data3 = two_streams(sim_shim)
    assert data1 not in (data2, data3)
    assert sim_shim.stats()["capture_deferred_frees"] == 1
    assert state_of(sim_shim, data1)["state"] == "deferred"


def test_what_still_waits_at_the_capture_end_is_deferred_as_before(reuse):
    x = read_on_s2_in_a_capture(reuse)
    reuse.free(x, F8, 0, S1)
    assert state_of(reuse, x)["state"] == "awaiting_join"
    wait_stream(reuse, S1, S2)
    end(reuse)  # joined, but nothing allocated on S1 after the join
    assert state_of(reuse, x)["state"] == "deferred"
    check_invariants()
    recorded = reuse.stats()["events_recorded"]
    reuse.process_events()  # no capture underway: the event at the free is recorded now
    assert reuse.stats()["events_recorded"] == recorded + 1
    reuse.sim.complete_all()
    reuse.process_events()
    assert state_of(reuse, x)["state"] == "cached"
    check_invariants()


def test_no_event_is_created_recorded_or_queried_during_the_capture(reuse):
    calls = {c: sim_calls(c) for c in ("event_create", "event_record", "event_query", "stream_wait_event")}
    own_events = 2  # the test's fork and join (sim.record_event)
    two_streams(reuse)
    assert sim_calls("capture_info") > 0 and sim_calls("node_parents") > 0
    assert sim_calls("event_create") == calls["event_create"] + own_events
    assert sim_calls("event_record") == calls["event_record"] + own_events
    assert sim_calls("event_query") == calls["event_query"]
    assert sim_calls("stream_wait_event") == calls["stream_wait_event"] + own_events


def test_the_reused_block_forgets_its_recorded_streams(reuse):
    x = read_on_s2_in_a_capture(reuse)
    reuse.free(x, F8, 0, S1)
    wait_stream(reuse, S1, S2)
    assert reuse.alloc(F8, 0, S1) == x
    block = state_of(reuse, x)
    assert block["state"] == "live" and block["recorded_streams"] == [] and block["held_events"] == []
    end(reuse)
    reuse.free(x, F8, 0, S1)  # nothing to wait for any more
    assert state_of(reuse, x)["state"] == "cached"
    check_invariants()


@pytest.mark.parametrize("case", ["recorded_stream_not_capturing", "use_event_before_the_capture",
                                  "eager_block", "no_captured_work_yet"])
def test_frees_the_graph_cannot_vouch_for_wait_for_the_capture_end(reuse, case):
    stream = S2
    if case == "eager_block":
        x = reuse.alloc(F8, 0, S1)  # before the capture: eager memory
        begin(reuse)
        wait_stream(reuse, S2, S1)
        use_on(reuse, S2, x)
    elif case == "use_event_before_the_capture":
        begin(reuse)
        x = reuse.alloc(F8, 0, S1)  # a graph's output
        end(reuse)
        reuse.record_use(x, S2)  # eager: an event, and only it can tell when S2 is done
        begin(reuse)  # the next capture into the same pool frees it
        wait_stream(reuse, S2, S1)
        use_on(reuse, S2, x)
    elif case == "recorded_stream_not_capturing":
        begin(reuse)
        x = reuse.alloc(F8, 0, S1)
        stream = S3  # never joins the capture
        use_on(reuse, S3, x)
    else:
        begin(reuse)
        x = reuse.alloc(F8, 0, S1)
        reuse.record_stream(x, S2)  # S2 joins no capture work touching x: no marker at all
        wait_stream(reuse, S2, S1)
    reuse.free(x, F8, 0, S1)
    assert state_of(reuse, x)["state"] == "deferred"
    wait_stream(reuse, S1, stream)
    reuse.sim.launch(S1)
    assert reuse.alloc(F8, 0, S1) != x
    check_invariants()
    end(reuse)
    check_invariants()


def test_a_failed_capture_info_at_the_free_defers_it(reuse):
    x = read_on_s2_in_a_capture(reuse)
    reuse.findings()
    sim_fail_next("capture_info")
    reuse.free(x, F8, 0, S1)
    assert state_of(reuse, x)["state"] == "deferred"
    assert [f["op"] for f in reuse.findings() if f["kind"] == "runtime_error"] == ["capture_info(free)"]
    wait_stream(reuse, S1, S2)
    assert reuse.alloc(F8, 0, S1) != x
    end(reuse)
    check_invariants()


def test_a_failed_graph_walk_reuses_nothing_until_a_walk_succeeds(reuse):
    x = read_on_s2_in_a_capture(reuse)
    reuse.free(x, F8, 0, S1)
    wait_stream(reuse, S1, S2)
    reuse.sim.launch(S1)
    reuse.findings()
    sim_fail_next("node_parents")
    assert reuse.alloc(F8, 0, S1) != x
    assert [f["op"] for f in reuse.findings() if f["kind"] == "runtime_error"] == ["node_parents(alloc)"]
    assert state_of(reuse, x)["state"] == "awaiting_join"
    check_invariants()
    assert reuse.alloc(F8, 0, S1) == x  # the walk runs again from scratch
    end(reuse)
    check_invariants()


def test_the_setting_is_off_after_reset_and_checked_as_a_flag(reuse):
    assert reuse.graph_capture_record_stream_reuse()
    with pytest.raises(TypeError):
        reuse.set_graph_capture_record_stream_reuse("yes")
    reuse.reset()
    reuse.select_runtime("sim")
    assert not reuse.graph_capture_record_stream_reuse()


def test_acl_has_no_capture_graph_the_setting_warns_and_frees_wait(acl_shim):
    from npu_lifetime import shim

    with pytest.warns(RuntimeWarning, match="not supported on the acl runtime"):
        shim.set_graph_capture_record_stream_reuse(True)
    assert shim.graph_capture_record_stream_reuse()
    shim.begin_allocate_to_pool(0, POOL, 0)
    acl_shim.fake_acl_set_capturing(S1, 1)
    acl_shim.fake_acl_set_capturing(S2, 1)
    x = shim.alloc(F8, 0, S1)
    shim.record_stream(x, S2)
    shim.free(x, F8, 0, S1)
    [f] = [f for f in shim.findings() if f["kind"] == "unsupported"]
    assert "acl runtime offers no capture topology" in f["detail"]
    assert state_of(shim, x)["state"] == "deferred"
    shim.free(shim.alloc(F8, 0, S1), F8, 0, S1)
    x2 = shim.alloc(F8, 0, S1)
    shim.record_stream(x2, S2)
    shim.free(x2, F8, 0, S1)
    assert [f for f in shim.findings() if f["kind"] == "unsupported"] == []  # said once
    acl_shim.fake_acl_set_capturing(S1, 0)
    acl_shim.fake_acl_set_capturing(S2, 0)
    shim.end_allocate_to_pool(0, POOL)
    check_invariants()
