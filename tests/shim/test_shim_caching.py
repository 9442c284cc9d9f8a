"""The shim's caching and its lifetime calls, on the simulated runtime."""
from conftest import S1, S2, S3

from helpers.shim_testing import pending_once_done


def test_freed_block_is_reused_on_its_stream_only(sim_shim):
    p = sim_shim.alloc(1000, 0, S1)
    sim_shim.free(p, 1000, 0, S1)
    assert sim_shim.alloc(1000, 0, S2) != p
    assert sim_shim.alloc(1000, 0, S1) == p
    assert sim_shim.stats()["cache_hits"] >= 1


def test_sizes_are_rounded_and_small_blocks_share_a_segment(sim_shim):
    a, b = sim_shim.alloc(1, 0, S1), sim_shim.alloc(513, 0, S1)
    assert b - a == 512
    st = sim_shim.stats()
    assert (st["segment.all.current"], st["allocated_bytes.all.current"], st["requested_bytes.all.current"]) == (
        1, 512 + 1024, 514)


def test_large_blocks_are_carved_from_large_segments(sim_shim):
    a = sim_shim.alloc(3 << 20, 0, S1)
    b = sim_shim.alloc(3 << 20, 0, S1)
    st = sim_shim.stats()
    assert st["segment.all.current"] == 1 and st["reserved_bytes.all.current"] == 20 << 20 and b - a == 3 << 20
    sim_shim.alloc(64 << 20, 0, S1)
    assert sim_shim.stats()["segment.all.current"] == 2


def test_zero_bytes_needs_no_memory(sim_shim):
    assert sim_shim.alloc(0, 0, S1) == 0
    sim_shim.free(0, 0, 0, S1)
    assert sim_shim.findings() == []


def test_record_use_defers_reuse_until_the_event_fires(sim_shim):
    p = sim_shim.alloc(4096, 0, S1)
    assert sim_shim.record_use(p, S2)
    sim_shim.free(p, 4096, 0, S1)
    st = sim_shim.stats()
    assert (st["pending.all.current"], st["deferred_frees"]) == (1, 1)
    assert sim_shim.alloc(4096, 0, S1) != p  # S2 still has the use queued
    sim_shim.sim.complete(S2)
    assert sim_shim.alloc(4096, 0, S1) == p  # polled at allocation


def test_record_use_covers_only_work_queued_before_the_call(sim_shim):
    p = sim_shim.alloc(4096, 0, S1)
    sim_shim.record_use(p, S2)
    sim_shim.sim.complete(S2)  # S2 progressed past the recorded event
    sim_shim.free(p, 4096, 0, S1)
    sim_shim.process_events()
    assert sim_shim.stats()["pending.all.current"] == 0


def test_record_stream_records_at_the_free(sim_shim):
    p = sim_shim.alloc(4096, 0, S1)
    assert sim_shim.record_stream(p, S2)
    sim_shim.sim.complete(S2)  # finishing earlier work does not matter:
    sim_shim.free(p, 4096, 0, S1)  # the event is recorded here
    sim_shim.process_events()
    assert sim_shim.stats()["pending.all.current"] == 1
    assert pending_once_done(sim_shim, S2) == 0


def test_erase_stream_withdraws_record_stream(sim_shim):
    p = sim_shim.alloc(4096, 0, S1)
    sim_shim.record_stream(p, S2)
    sim_shim.erase_stream(p, S2)
    sim_shim.free(p, 4096, 0, S1)
    assert sim_shim.stats()["pending.all.current"] == 0


def test_calls_on_the_allocation_stream_are_no_ops(sim_shim):
    p = sim_shim.alloc(4096, 0, S1)
    sim_shim.record_use(p, S1)
    sim_shim.record_stream(p, S1)
    sim_shim.free(p, 4096, 0, S1)
    st = sim_shim.stats()
    assert (st["pending.all.current"], st["events_recorded"]) == (0, 0)


def test_one_live_event_per_block_and_stream(sim_shim):
    p = sim_shim.alloc(4096, 0, S1)
    for _ in range(1000):
        sim_shim.record_use(p, S2)
    sim_shim.record_use(p, S3)
    st = sim_shim.stats()
    assert (st["events_created"], st["events_recorded"]) == (2, 1001)
    [block] = [b for seg in sim_shim.snapshot()["segments"] for b in seg["blocks"] if b["address"] == p]
    assert sorted(e["stream"] for e in block["use_events"]) == [S2, S3]
    sim_shim.free(p, 4096, 0, S1)
    assert pending_once_done(sim_shim, S2) == 1  # still waits for S3
    assert pending_once_done(sim_shim, S3) == 0


def test_events_are_pooled(sim_shim):
    for _ in range(50):
        p = sim_shim.alloc(4096, 0, S1)
        sim_shim.record_use(p, S2)
        sim_shim.free(p, 4096, 0, S1)
        sim_shim.sim.complete(S2)
        sim_shim.process_events()
    assert sim_shim.stats()["events_created"] == 1


def test_stream_wait_policy_hands_the_block_out_at_once(sim_shim):
    sim_shim.set_policy("stream_wait")
    p = sim_shim.alloc(4096, 0, S1)
    sim_shim.record_use(p, S2)
    sim_shim.record_stream(p, S3)
    sim_shim.free(p, 4096, 0, S1)
    assert sim_shim.stats()["pending.all.current"] == 0
    assert sim_shim.alloc(4096, 0, S1) == p
    assert sim_shim.sim.stream_waits(S1) == 2  # one GPU-side wait per held event
    assert sim_shim.stats()["stream_waits"] == 2


def test_stream_wait_policy_holds_blocks_back_during_capture(sim_shim):
    sim_shim.set_policy("stream_wait")
    p, _q = sim_shim.alloc(1 << 20, 0, S1), sim_shim.alloc(1 << 20, 0, S1)  # fill a segment
    sim_shim.record_use(p, S2)
    sim_shim.free(p, 1 << 20, 0, S1)
    sim_shim.sim.set_capturing(S1, True)
    r = sim_shim.alloc(1 << 20, 0, S1)
    assert r not in (0, p) and sim_shim.sim.stream_waits(S1) == 0
    sim_shim.sim.set_capturing(S1, False)
    sim_shim.free(r, 1 << 20, 0, S1)  # its segment is whole again: p is the best fit
    assert sim_shim.alloc(1 << 20, 0, S1) == p
    assert sim_shim.sim.stream_waits(S1) == 1


def test_no_polling_while_the_allocating_stream_captures(sim_shim):
    p = sim_shim.alloc(4096, 0, S1)
    sim_shim.record_use(p, S2)
    sim_shim.free(p, 4096, 0, S1)
    sim_shim.sim.complete(S2)
    sim_shim.sim.set_capturing(S1, True)
    assert sim_shim.alloc(4096, 0, S1) != p
    assert sim_shim.stats()["pending.all.current"] == 1
    sim_shim.sim.set_capturing(S1, False)
    assert sim_shim.alloc(4096, 0, S1) == p


def test_record_use_on_a_capturing_stream_falls_back_to_record_stream(sim_shim):
    p = sim_shim.alloc(4096, 0, S1)
    sim_shim.sim.set_capturing(S2, True)
    sim_shim.record_use(p, S2)
    sim_shim.sim.set_capturing(S2, False)
    [block] = [b for seg in sim_shim.snapshot()["segments"] for b in seg["blocks"] if b["address"] == p]
    assert block["recorded_streams"] == [S2] and block["use_events"] == []


def test_empty_cache_returns_free_segments(sim_shim):
    p = sim_shim.alloc(4096, 0, S1)
    q = sim_shim.alloc(4096, 0, S2)
    sim_shim.free(p, 4096, 0, S1)
    sim_shim.empty_cache()
    st = sim_shim.stats()
    assert (st["segment.all.current"], st["num_device_free"], st["allocation.all.current"]) == (1, 1, 1)
    sim_shim.free(q, 4096, 0, S2)
    sim_shim.empty_cache()
    assert sim_shim.stats()["reserved_bytes.all.current"] == 0


def test_out_of_memory_frees_the_cache_and_retries_once(sim_shim):
    sim_shim.sim.set_memory_limit(3 << 20)
    p = sim_shim.alloc(4096, 0, S1)  # a 2 MiB segment
    sim_shim.free(p, 4096, 0, S1)
    assert sim_shim.alloc(4096, 0, S2) != 0  # a second segment fits only once p's is freed
    st = sim_shim.stats()
    assert (st["num_alloc_retries"], st["num_ooms"], st["num_device_free"], st["segment.all.current"]) == (1, 0, 1, 1)


def test_out_of_memory_returns_null_with_a_finding(sim_shim):
    sim_shim.sim.set_memory_limit(4 << 20)
    assert sim_shim.alloc(3 << 20, 0, S1) == 0  # needs a 20 MiB segment
    st = sim_shim.stats()
    assert (st["num_alloc_retries"], st["num_ooms"]) == (1, 1)
    [f] = sim_shim.findings()
    assert (f["kind"], f["size"], f["stream"]) == ("out_of_memory", 3 << 20, S1)


def test_snapshot_describes_blocks_streams_and_events(sim_shim):
    p = sim_shim.alloc(100, 0, S1)
    sim_shim.record_stream(p, S2)
    sim_shim.record_use(p, S3)
    snap = sim_shim.snapshot()
    assert snap["runtime"] == "sim" and snap["policy"] == "poll"
    [seg] = snap["segments"]
    block = seg["blocks"][0]
    assert block == {
        "address": p, "size": 512, "requested": 100, "state": "live", "alloc_stream": S1, "generation": 1,
        "recorded_streams": [S2], "use_events": [{"stream": S3, "kind": "record_use"}],
        "held_events": [],
    }
    assert seg["blocks"][1]["state"] == "cached"


def test_simulated_streams_wait_on_events_and_fills_land_in_order(sim_shim):
    # the simulated runtime's model, which the debug-mode tests rely on
    import ctypes

    sim_shim.set_policy("stream_wait")
    p = sim_shim.alloc(4096, 0, S1)
    ctypes.memset(p, 1, 4096)
    read = sim_shim.sim.launch(S2)  # a kernel on S2 reading p
    sim_shim.record_use(p, S2)
    sim_shim.free(p, 4096, 0, S1)
    q = sim_shim.alloc(4096, 0, S1)  # reused at once: S1 now waits for S2's event
    assert q == p
    sim_shim.set_debug(True, 1 << 20)  # from here freed blocks are poisoned on their stream
    sim_shim.free(q, 4096, 0, S1)
    sim_shim.sim.complete(S1)  # blocked behind the wait: the fill has not landed
    assert ctypes.string_at(p, 1) == b"\x01"
    sim_shim.sim.complete_to(S2, read)  # the reader ran ...
    sim_shim.sim.complete(S2)  # ... and S2 passed the event
    sim_shim.sim.complete(S1)
    assert ctypes.string_at(p, 1) == b"\xff"
    sim_shim.set_debug(False)


def test_the_simulated_free_waits_for_the_device_and_counts_work_left_on_the_memory(sim_shim):
    """(issue 37) The simulated runtime's free did not wait for queued work as
    cudaFree does: a fill queued on a segment empty_cache gave back landed in
    freed host memory.  Now every stream runs to its end first, and a fill
    still queued on the memory at its free counts as an illegal access (a
    runtime whose free does not wait would run it on freed memory)."""
    before = sim_shim.sim.illegal_accesses()
    p = sim_shim.alloc(1 << 20, 0, S1)
    assert sim_shim.sim.fill(S2, p, 7, 4096)  # S2 writes it, undeclared, still queued
    sim_shim.free(p, 1 << 20, 0, S1)
    sim_shim.empty_cache()  # the shim waits for S1 only: S2's write is the program's bug
    assert sim_shim.sim.illegal_accesses() == before + 1
    q = sim_shim.alloc(1 << 20, 0, S1)
    assert sim_shim.sim.fill(S1, q, 7, 4096)  # queued on the segment's own stream
    sim_shim.free(q, 1 << 20, 0, S1)
    sim_shim.empty_cache()  # the shim synchronises S1 before the free: nothing left on it
    assert sim_shim.sim.illegal_accesses() == before + 1


def test_reset_accumulated_zeroes_the_counters_torchs_reset_zeroes(sim_shim):
    """torch's resetAccumulatedStats zeroes num_alloc_retries, num_ooms,
    num_sync_all_streams, num_device_alloc and num_device_free; the shim
    kept them (the side-by-side suite on the H200: num_device_alloc 24
    against torch's 2 after a reset).  Its own diagnostics run on."""
    sim_shim.sim.set_memory_limit(32 << 20)
    kept = sim_shim.alloc(20 << 20, 0, S1)
    assert kept and sim_shim.alloc(30 << 20, 0, S1) == 0  # the out-of-memory path, then an OOM
    sim_shim.free(kept, 20 << 20, 0, S1)
    again = sim_shim.alloc(20 << 20, 0, S1)  # a cache hit
    sim_shim.free(again, 20 << 20, 0, S1)
    sim_shim.empty_cache()
    before = sim_shim.stats()
    torchs = ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc", "num_device_free")
    assert all(before[k] > 0 for k in torchs if k != "num_sync_all_streams") and before["cache_hits"] > 0
    sim_shim.reset_accumulated(0)
    after = sim_shim.stats()
    assert [after[k] for k in torchs] == [0] * 5
    assert after["cache_hits"] == before["cache_hits"] and after["findings"] == before["findings"]
