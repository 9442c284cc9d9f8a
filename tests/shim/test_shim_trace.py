"""The allocator trace: what happened to each block, in order, for
timelines and torch's memory viewer."""
from conftest import S1, S2


def kinds(events, ptr):
    return [e["kind"] for e in events if e["ptr"] == ptr and e["kind"] != "segment_alloc"]


def test_the_trace_follows_a_block_through_record_use_free_and_reuse(sim_shim):
    sim_shim.set_policy("poll")
    sim_shim.set_trace(True, 1000)
    x = sim_shim.alloc(4096, 0, S1)
    sim_shim.record_use(x, S2)
    sim_shim.free(x, 4096, 0, S1)
    sim_shim.sim.complete(S2)
    y = sim_shim.alloc(4096, 0, S1)
    events = sim_shim.trace()
    sim_shim.set_trace(False)
    assert y == x
    assert kinds(events, x) == ["alloc", "record_use", "free", "pending", "reusable", "alloc"]
    record = next(e for e in events if e["kind"] == "record_use")
    assert (record["stream"], record["alloc_stream"], record["generation"]) == (S2, S1, 1)
    assert [e["generation"] for e in events if e["kind"] == "alloc"] == [1, 2]
    assert all(a["t_ns"] <= b["t_ns"] for a, b in zip(events, events[1:]))
    assert sim_shim.trace() == []  # drained


def test_a_full_ring_drops_the_oldest_and_counts_them(sim_shim):
    sim_shim.set_trace(True, 4)
    for _ in range(5):
        sim_shim.free(sim_shim.alloc(64, 0, S1), 64, 0, S1)
    events = sim_shim.trace()
    sim_shim.set_trace(False)
    assert len(events) == 4 and sim_shim.stats()["trace_dropped"] > 0


def test_the_trace_is_off_by_default(sim_shim):
    sim_shim.free(sim_shim.alloc(64, 0, S1), 64, 0, S1)
    assert sim_shim.trace() == []
