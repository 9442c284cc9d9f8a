"""The reuse policies on the simulated runtime, and the rule for pending
waits across split and merge (design/allocator-shim.md, "Reuse policies"):
the part handed out waits, the remainder never waits twice, and a block
holds at most one event per stream."""
import random

import pytest

from conftest import S1, S2, S3

KB = 1024


def held_events(shim, ptr):
    for seg in shim.snapshot()["segments"]:
        for b in seg["blocks"]:
            if b["address"] == ptr:
                return b["held_events"]
    raise AssertionError(f"no block at {ptr:#x}")


def test_lazy_wait_is_the_default(sim_shim):
    sim_shim.reset()
    assert sim_shim.policy() == "lazy_wait"


def test_lazy_wait_reuses_at_once_behind_a_gpu_side_wait(sim_shim):
    sim_shim.set_policy("lazy_wait")
    p = sim_shim.alloc(4 * KB, 0, S1)
    sim_shim.record_use(p, S2)
    sim_shim.free(p, 4 * KB, 0, S1)
    s = sim_shim.stats()
    assert (s["pending.all.current"], s["waiting.all.current"]) == (0, 1)  # in the pool, with its event
    assert sim_shim.alloc(4 * KB, 0, S1) == p
    assert sim_shim.sim.stream_waits(S1) == 1 and sim_shim.stats()["stream_waits"] == 1


def test_lazy_wait_skips_the_wait_when_the_event_already_fired(sim_shim):
    sim_shim.set_policy("lazy_wait")
    p = sim_shim.alloc(4 * KB, 0, S1)
    sim_shim.record_use(p, S2)
    sim_shim.free(p, 4 * KB, 0, S1)
    sim_shim.sim.complete(S2)
    assert sim_shim.alloc(4 * KB, 0, S1) == p
    assert sim_shim.sim.stream_waits(S1) == 0


def test_lazy_wait_keeps_torchs_rule_for_record_stream(sim_shim):
    sim_shim.set_policy("lazy_wait")
    p = sim_shim.alloc(4 * KB, 0, S1)
    sim_shim.record_stream(p, S2)
    sim_shim.free(p, 4 * KB, 0, S1)
    assert sim_shim.stats()["pending.all.current"] == 1
    assert sim_shim.alloc(4 * KB, 0, S1) != p
    sim_shim.sim.complete(S2)
    assert sim_shim.alloc(4 * KB, 0, S1) == p and sim_shim.sim.stream_waits(S1) == 0


def test_lazy_wait_holds_a_noted_unrecorded_use_until_it_finished(sim_shim):
    sim_shim.set_policy("lazy_wait")
    p = sim_shim.alloc(4 * KB, 0, S1)
    sim_shim.note_use(p, S2)
    sim_shim.free(p, 4 * KB, 0, S1)
    assert [f["kind"] for f in sim_shim.findings()] == ["unrecorded_use"]
    assert sim_shim.stats()["pending.all.current"] == 1


def test_the_part_handed_out_waits_and_the_remainder_never_waits_twice(sim_shim):
    sim_shim.set_policy("lazy_wait")
    p = sim_shim.alloc(3 * KB, 0, S1)
    sim_shim.record_use(p, S2)
    sim_shim.free(p, 3 * KB, 0, S1)  # the whole 2 MiB segment is one cached block carrying S2's event
    a = sim_shim.alloc(1 * KB, 0, S1)  # best fit: that block, split
    assert a == p and sim_shim.sim.stream_waits(S1) == 1
    b = sim_shim.alloc(1 * KB, 0, S1)  # the remainder: no second wait
    assert b == p + 1 * KB and sim_shim.sim.stream_waits(S1) == 1
    assert held_events(sim_shim, b + 1 * KB) == []


def test_merged_blocks_keep_one_event_per_stream_the_later(sim_shim):
    sim_shim.set_policy("lazy_wait")
    a = sim_shim.alloc(1 * KB, 0, S1)
    b = sim_shim.alloc(1 * KB, 0, S1)
    keep = sim_shim.alloc(1 * KB, 0, S1)  # keeps the rest of the segment from merging in
    sim_shim.record_use(a, S2)
    sim_shim.record_use(b, S2)
    sim_shim.record_use(b, S3)
    sim_shim.free(a, 1 * KB, 0, S1)
    sim_shim.free(b, 1 * KB, 0, S1)  # merges with a
    held = held_events(sim_shim, a)
    assert sorted(h["stream"] for h in held) == [S2, S3]
    assert sim_shim.stats()["events_created"] == 3 and sim_shim.sim.incomplete_events() == 3
    sim_shim.free(keep, 1 * KB, 0, S1)


@pytest.mark.parametrize("policy", ["lazy_wait", "stream_wait"])
def test_peak_memory_does_not_depend_on_timing(sim_shim, policy):
    # The RFC's design-critical test, on the simulated runtime: the same
    # program gives the same addresses and the same peak whether the
    # consumer stream finishes at once, late, or never before reuse.
    def run(finish_every):
        sim_shim.reset()
        sim_shim.select_runtime("sim")
        sim_shim.set_policy(policy)
        rng = random.Random(0)
        addresses, live, segments = [], [], {}
        for step in range(300):
            size = rng.choice((600, 4 * KB, 70 * KB, 3 << 20))
            p = sim_shim.alloc(size, 0, S1)
            base, _ = sim_shim.base_allocation(p)  # host addresses differ run to run: name segments
            addresses.append((segments.setdefault(base, len(segments)), p - base))
            sim_shim.record_use(p, S2)
            live.append((p, size))
            if len(live) > 4:
                q, qsize = live.pop(rng.randrange(len(live)))
                sim_shim.free(q, qsize, 0, S1)
            if finish_every and step % finish_every == 0:
                sim_shim.sim.complete(S2)
        return addresses, sim_shim.stats()["reserved_bytes.all.peak"]

    fast, slow, never = run(1), run(17), run(0)
    assert fast == slow == never


def test_poll_peak_does_depend_on_timing(sim_shim):
    # the contrast that motivates lazy_wait: the same program under poll
    def run(finish):
        sim_shim.reset()
        sim_shim.select_runtime("sim")
        sim_shim.set_policy("poll")
        for _ in range(8):
            p = sim_shim.alloc(3 << 20, 0, S1)
            sim_shim.record_use(p, S2)
            sim_shim.free(p, 3 << 20, 0, S1)
            if finish:
                sim_shim.sim.complete(S2)
        return sim_shim.stats()["reserved_bytes.all.peak"]

    assert run(finish=False) > run(finish=True)
