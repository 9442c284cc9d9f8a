"""Expandable segments on the simulated runtime (its virtual memory: a
reservation is address space with no access, mapped pages are usable): one
segment per (device, stream, size class) that grows by mapping pages at its
end, shrinks by unmapping free pages at its end, never unmaps a block that
waits on events, and keeps plain segments for graph pools; statistics and
the snapshot as torch reports them; the invariant checker after each step."""
import ctypes

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import S1, S2
from helpers.shim_testing import check_invariants, sim_calls, sim_completed, sim_fail_next

MB = 1 << 20
# (size class, bytes per page, a request of that class)
CLASSES = {"small": (2 * MB, 256 * 1024), "large": (20 * MB, 6 * MB)}


@pytest.fixture
def xshim(sim_shim):
    sim_shim.set_expandable_segments(True)
    yield sim_shim
    sim_shim.set_expandable_segments(False)


def reserved(s):
    return s.stats()["reserved_bytes.all.current"]


@pytest.mark.parametrize("size_class", CLASSES)
def test_growth_is_in_place_in_one_segment(xshim, size_class):
    page, size = CLASSES[size_class]
    ptrs = [xshim.alloc(size, 0, S1)]
    while reserved(xshim) < 2 * page:  # until a second page had to be mapped
        ptrs.append(xshim.alloc(size, 0, S1))
        assert ptrs[-1] == ptrs[-2] + size, "the allocation right after the one before"
        check_invariants()
    [seg] = xshim.snapshot()["segments"]
    assert seg["is_expandable"] and seg["size"] == 2 * page == xshim.sim.mapped_bytes()
    stats = xshim.stats()
    assert stats["num_device_alloc"] == 2  # a map each time, as torch counts them
    assert stats["segment.all.current"] == 0  # torch leaves expandable segments out of the count
    assert stats["inactive_split.all.current"] == 0
    assert xshim.sim.accessible(ptrs[0], len(ptrs) * size)
    for p in ptrs:
        xshim.free(p, size, 0, S1)
    check_invariants()


def test_contents_survive_growth(xshim):
    refused = xshim.sim.illegal_accesses()
    a = xshim.alloc(15 * MB, 0, S1)
    assert xshim.sim.fill(S1, a, 0x5A, 15 * MB)
    xshim.sim.complete(S1)
    b = xshim.alloc(30 * MB, 0, S1)  # maps more pages after a's
    assert b == a + 15 * MB
    assert ctypes.string_at(a, 15 * MB) == b"\x5a" * (15 * MB)
    assert xshim.sim.illegal_accesses() == refused


@pytest.mark.parametrize("size_class", CLASSES)
def test_empty_cache_unmaps_the_free_pages_at_the_end(xshim, size_class):
    page, size = CLASSES[size_class]
    first = xshim.alloc(size, 0, S1)
    rest = []
    while reserved(xshim) < 3 * page:
        rest.append(xshim.alloc(size, 0, S1))
    for p in rest:
        xshim.free(p, size, 0, S1)
    before = xshim.stats()
    xshim.empty_cache()
    check_invariants()
    after = xshim.stats()
    assert reserved(xshim) == page == xshim.sim.mapped_bytes(), "only the page the live block uses stays"
    assert after["num_device_free"] - before["num_device_free"] == 1
    assert xshim.sim.accessible(first, size) and not xshim.sim.accessible(first + page, 1)
    refused = xshim.sim.illegal_accesses()
    assert not xshim.sim.fill(S1, first + page, 0, 512)  # a kernel touching an unmapped page: refused
    assert xshim.sim.illegal_accesses() == refused + 1
    xshim.free(first, size, 0, S1)
    xshim.empty_cache()
    assert reserved(xshim) == 0 and xshim.sim.mapped_bytes() == 0 and xshim.sim.reserved_bytes() == 0
    assert xshim.snapshot()["segments"] == []
    check_invariants()


def test_reuse_across_a_page_edge_then_shrink_cuts_the_free_block_at_the_edge(xshim):
    a = xshim.alloc(15 * MB, 0, S1)  # page 0: [0, 15) live, [15, 20) free
    b = xshim.alloc(10 * MB, 0, S1)  # [15, 25): crosses the edge at 20 MiB
    assert b == a + 15 * MB and reserved(xshim) == 40 * MB
    xshim.free(a, 15 * MB, 0, S1)
    c = xshim.alloc(12 * MB, 0, S1)  # the freed front is reused
    assert c == a
    xshim.free(b, 10 * MB, 0, S1)  # [12, 40) free: merged with the end
    [seg] = xshim.snapshot()["segments"]
    assert [blk["state"] for blk in seg["blocks"]] == ["live", "cached"]
    xshim.empty_cache()  # the free block is cut at the 20 MiB edge; the page after it goes
    check_invariants()
    [seg] = xshim.snapshot()["segments"]
    assert seg["size"] == 20 * MB and [blk["size"] for blk in seg["blocks"]] == [12 * MB, 8 * MB]
    assert xshim.alloc(8 * MB, 0, S1) == a + 12 * MB  # the cut block is still usable
    check_invariants()


@pytest.mark.parametrize("policy", ["poll", "lazy_wait"])
def test_a_block_waiting_on_a_use_event_is_never_unmapped(xshim, policy):
    xshim.set_policy(policy)
    keep = xshim.alloc(6 * MB, 0, S1)
    used = xshim.alloc(30 * MB, 0, S1)  # [6, 36): the second page is its
    xshim.record_stream(used, S2)  # S2 reads it; torch's rule: held until S2 is there
    xshim.free(used, 30 * MB, 0, S1)
    state = {b["address"]: b["state"] for b in xshim.snapshot()["segments"][0]["blocks"]}
    assert state[used] == "pending"
    xshim.sim.set_memory_limit(40 * MB)
    sim_fail_next("event_synchronize", 100)  # the out-of-memory path can't wait for S2 on the host
    sim_fail_next("stream_synchronize", 100)
    assert xshim.alloc(100 * MB, 0, S1) == 0  # it releases what is free, and must not unmap `used`
    sim_fail_next("event_synchronize", 0)
    sim_fail_next("stream_synchronize", 0)
    check_invariants()
    assert sim_completed(S2) == 0, "the situation: S2 has not run"
    assert xshim.sim.accessible(used, 30 * MB), "unmapped while S2 could still read it"
    assert reserved(xshim) == 40 * MB
    # empty_cache first waits for S2 (the host), then the pages go
    xshim.findings()
    xshim.empty_cache()
    check_invariants()
    assert xshim.sim.event_syncs() > 0 and sim_completed(S2) > 0
    assert reserved(xshim) == 20 * MB and not xshim.sim.accessible(used + 14 * MB, 1)
    xshim.free(keep, 6 * MB, 0, S1)


def test_a_cached_block_carrying_an_event_is_not_unmapped_by_the_oom_path_before_its_wait(xshim):
    xshim.set_policy("stream_wait")  # freed blocks go back to the pool at once, carrying their events
    keep = xshim.alloc(6 * MB, 0, S1)
    used = xshim.alloc(30 * MB, 0, S1)
    xshim.record_use(used, S2)
    xshim.free(used, 30 * MB, 0, S1)
    [seg] = xshim.snapshot()["segments"]
    assert seg["blocks"][-1]["held_events"], "the situation: a cached block with a pending use event"
    xshim.sim.set_memory_limit(40 * MB)
    assert xshim.alloc(100 * MB, 0, S2) == 0
    check_invariants()
    assert xshim.sim.event_syncs() > 0  # its event was waited for before the pages went
    xshim.free(keep, 6 * MB, 0, S1)


def test_the_pages_of_a_capturing_streams_segment_stay_mapped(xshim):
    """An unmap first synchronises the segment's stream; during a capture on
    it that would invalidate the capture: the pages wait for the next empty_cache."""
    keep = xshim.alloc(6 * MB, 0, S1)
    b = xshim.alloc(30 * MB, 0, S1)
    xshim.free(b, 30 * MB, 0, S1)
    xshim.sim.set_capturing(S1, True)
    syncs = sim_calls("stream_synchronize")
    xshim.empty_cache()
    assert sim_calls("stream_synchronize") == syncs and reserved(xshim) == 40 * MB
    check_invariants()
    xshim.sim.set_capturing(S1, False)
    xshim.empty_cache()
    assert reserved(xshim) == 20 * MB and sim_calls("stream_synchronize") == syncs + 1
    xshim.free(keep, 6 * MB, 0, S1)


def test_graph_pools_keep_plain_segments_and_the_next_eager_allocation_is_expandable(xshim):
    """torch's test_mempool_expandable, on the simulated runtime."""
    xshim.create_or_incref_pool(0, (7, 0))
    xshim.begin_allocate_to_pool(0, (7, 0), S1)
    in_pool = xshim.alloc(MB, 0, S1)
    xshim.end_allocate_to_pool(0, (7, 0))
    eager = xshim.alloc(MB, 0, S1)
    segments = xshim.snapshot()["segments"]
    assert len(segments) == 2
    assert sorted(s["is_expandable"] for s in segments) == [False, True]
    [expandable] = [s for s in segments if s["is_expandable"]]
    assert expandable["graph_pool"] == [0, 0] and expandable["blocks"][0]["address"] == eager
    records = {r["address"]: r["expandable"] for r in xshim.block_records()}
    assert records[in_pool] == 0 and records[eager] == 1
    check_invariants()


def test_one_segment_per_stream_and_size_class(xshim):
    for stream in (S1, S2):
        xshim.alloc(6 * MB, 0, stream)
        xshim.alloc(100_000, 0, stream)
    segments = xshim.snapshot()["segments"]
    assert len(segments) == 4 and all(s["is_expandable"] for s in segments)
    assert {(s["stream"], s["pool"]) for s in segments} == {(S1, "small"), (S1, "large"), (S2, "small"), (S2, "large")}
    check_invariants()


def test_turning_the_setting_off_mid_run_keeps_old_segments_and_makes_plain_ones(xshim):
    a = xshim.alloc(6 * MB, 0, S1)
    xshim.free(a, 6 * MB, 0, S1)  # a free expandable block, 20 MiB
    xshim.set_expandable_segments(False)
    b = xshim.alloc(6 * MB, 0, S1)  # torch's rule: expandable blocks are left alone while off
    segments = xshim.snapshot()["segments"]
    assert len(segments) == 2 and sorted(s["is_expandable"] for s in segments) == [False, True]
    assert b not in range(segments[0]["address"], segments[0]["address"] + 20 * MB) or not segments[0]["is_expandable"]
    check_invariants()
    xshim.set_expandable_segments(True)
    c = xshim.alloc(16 * MB, 0, S1)  # on again: the expandable segment's free block (the plain one has 14)
    assert [s for s in xshim.snapshot()["segments"] if s["is_expandable"]][0]["address"] == c
    xshim.free(b, 6 * MB, 0, S1)
    xshim.free(c, 16 * MB, 0, S1)
    xshim.set_expandable_segments(False)
    xshim.empty_cache()  # off: the expandable segment's pages still go back
    assert reserved(xshim) == 0 and xshim.sim.mapped_bytes() == 0
    check_invariants()


def test_a_request_beyond_the_reserved_range_is_a_clean_out_of_memory(xshim):
    xshim.sim.set_memory_limit(64 * MB)  # the device's memory: the range is 72 MiB
    a = xshim.alloc(30 * MB, 0, S1)
    assert xshim.alloc(100 * MB, 0, S1) == 0
    assert "out of memory" in xshim.last_oom_message()
    [f] = xshim.findings()
    assert f["kind"] == "out_of_memory"
    check_invariants()
    assert xshim.alloc(20 * MB, 0, S1) == a + 30 * MB  # the program goes on in the same segment
    check_invariants()


def test_a_failed_map_changes_nothing_and_is_out_of_memory(xshim):
    a = xshim.alloc(6 * MB, 0, S1)
    sim_fail_next("vm_map", 100)  # every map of this allocation and its retries fails
    assert xshim.alloc(30 * MB, 0, S1) == 0
    check_invariants()
    assert xshim.sim.mapped_bytes() == reserved(xshim) == 20 * MB
    sim_fail_next("vm_map", 0)
    assert xshim.alloc(30 * MB, 0, S1) == a + 6 * MB
    check_invariants()


def test_the_memory_fraction_counts_mapped_pages(xshim):
    xshim.sim.set_memory_limit(100 * MB)
    xshim.set_memory_fraction(0.5, 0)
    assert xshim.alloc(30 * MB, 0, S1) != 0  # 40 MiB mapped
    assert xshim.alloc(15 * MB, 0, S1) == 0  # 60 MiB would pass 50
    assert "memory fraction 0.5" in xshim.last_oom_message()
    check_invariants()


def test_an_unsupported_runtime_warns_once_and_uses_plain_segments(acl_shim, capfd):
    from npu_lifetime import shim

    shim.set_expandable_segments(True)
    a = shim.alloc(MB, 0, S1)
    b = shim.alloc(6 * MB, 0, S1)
    kinds = [f["kind"] for f in shim.findings()]
    assert kinds.count("unsupported_setting") == 1
    assert capfd.readouterr().err.count("expandable_segments is not supported") == 1
    segments = shim.snapshot()["segments"]
    assert len(segments) == 2 and not any(s["is_expandable"] for s in segments)
    shim.free(a, MB, 0, S1)
    shim.free(b, 6 * MB, 0, S1)
    shim.set_expandable_segments(False)


@pytest.mark.parametrize("call", ["vm_reserve", "vm_create"])
def test_a_runtime_whose_virtual_memory_fails_at_first_use_gets_plain_segments(xshim, capfd, call):
    """A device without virtual-memory support (or a stub): the first
    reservation or mapping fails other than for lack of memory."""
    sim_fail_next(call, 1)
    a = xshim.alloc(6 * MB, 0, S1)
    b = xshim.alloc(6 * MB, 0, S2)  # no second try: refused for good
    assert a and b
    [f] = xshim.findings()
    assert f["kind"] == "unsupported_setting" and "failed: error 1" in f["detail"]
    assert capfd.readouterr().err.count("expandable_segments is not supported on the sim runtime") == 1
    segments = xshim.snapshot()["segments"]
    assert len(segments) == 2 and not any(s["is_expandable"] for s in segments)
    assert sim_calls("vm_reserve") == 1
    check_invariants()


STREAMS = (S1, S2)
SIZES = (512, 100_000, MB, 3 * MB, 6 * MB, 25 * MB)
op = st.one_of(
    st.tuples(st.just("alloc"), st.sampled_from(SIZES), st.sampled_from(STREAMS)),
    st.tuples(st.just("free"), st.integers(0, 20)),
    st.tuples(st.just("record_stream"), st.integers(0, 20), st.sampled_from(STREAMS)),
    st.tuples(st.just("record_use"), st.integers(0, 20), st.sampled_from(STREAMS)),
    st.tuples(st.just("complete"), st.sampled_from(STREAMS)),
    st.tuples(st.just("empty_cache")),
    st.tuples(st.just("setting"), st.booleans()),
)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.sampled_from(["poll", "lazy_wait", "stream_wait"]), st.lists(op, max_size=40))
def test_random_programs_keep_the_invariants_and_never_lose_live_memory(policy, program):
    from npu_lifetime import shim

    shim.reset()
    shim.select_runtime("sim")
    shim.set_policy(policy)
    shim.sim.set_memory_limit(400 * MB)
    shim.set_expandable_segments(True)
    live = {}  # ptr -> (size, stream, streams that used it)
    waiting = {}  # freed ptr -> (size, {stream: its position at the free}): must stay mapped until there
    try:
        for step in program:
            kind = step[0]
            if kind == "alloc":
                _, size, stream = step
                p = shim.alloc(size, 0, stream)
                if p:
                    assert shim.sim.accessible(p, size), f"{step}: handed out unmapped memory"
                    for q, (qsize, *_rest) in live.items():
                        assert p + size <= q or q + qsize <= p, f"{step}: overlaps a live block"
                    live[p] = (size, stream, set())
            elif kind == "free" and live:
                p = sorted(live)[step[1] % len(live)]
                size, stream, used = live.pop(p)
                shim.free(p, size, 0, stream)
                if used:
                    waiting[p] = (size, {s: shim.sim.launch(s) - 1 for s in used})
            elif kind in ("record_stream", "record_use") and live:
                p = sorted(live)[step[1] % len(live)]
                getattr(shim, kind)(p, step[2])
                if step[2] != live[p][1]:
                    live[p][2].add(step[2])
            elif kind == "complete":
                shim.sim.complete(step[1])
            elif kind == "empty_cache":
                shim.empty_cache()
            elif kind == "setting":
                shim.set_expandable_segments(step[1])
            check_invariants()
            for p, (size, *_rest) in live.items():
                assert shim.sim.accessible(p, size), f"after {step}: a live block was unmapped"
            for p, (size, positions) in list(waiting.items()):
                if all(sim_completed(s) >= at for s, at in positions.items()):
                    del waiting[p]
                else:
                    assert shim.sim.accessible(p, size), f"after {step}: unmapped while a stream could still use it"
    finally:
        shim.reset()
        shim.sim.set_memory_limit(0)
        shim.set_policy("poll")


@pytest.mark.parametrize("value, on", [("expandable_segments:True", True), ("expandable_segments:true", True),
                                       ("max_split_size_mb:64, expandable_segments:True", True),
                                       ("expandable_segments:False", False), ("", False),
                                       ("max_split_size_mb:64", False)])
def test_the_alloc_conf_variable_is_read_as_torch_reads_it(monkeypatch, value, on):
    from npu_lifetime.shim.install import alloc_conf_expandable

    monkeypatch.setenv("PYTORCH_NPU_ALLOC_CONF", value)
    assert alloc_conf_expandable("PYTORCH_NPU_ALLOC_CONF") is on
