"""The cached pair's shortcut (caching_allocator.cpp, "the cached pair"): a
free may leave its block unmerged for the next allocation to take back.
Every outcome must be the one without the shortcut: each sequence runs
twice, once as is and once with the invariant checker (an entry point, so
it merges any unmerged block first) after every step, and the two runs must
hand out the same addresses and end with the same blocks and statistics."""
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import S1, S2
from npu_lifetime import shim
from helpers.shim_testing import check_invariants

# 4000 and 4096 (and (1 << 20) - 100 and 1 << 20) round alike: a pair of the same block for another requested size
SIZES = (512, 4000, 4096, 8192, 100_000, (1 << 20) - 100, 1 << 20, (1 << 20) + 512, 3 << 20, 12 << 20)

op = st.one_of(
    st.tuples(st.just("alloc"), st.sampled_from(SIZES), st.sampled_from((S1, S2))),
    st.tuples(st.just("free"), st.integers(0, 30)),
    # the pattern the shortcut is for: free the newest block, allocate its size again (None) or another
    st.tuples(st.just("pair"), st.one_of(st.none(), st.sampled_from(SIZES))),
    st.tuples(st.just("record_stream"), st.integers(0, 30)),
    st.tuples(st.just("complete")),
    st.tuples(st.just("process")),
    st.tuples(st.just("empty_cache")),
    # entry points that read or reset the statistics while a repeated pair is uncounted
    st.tuples(st.just("read_stats")),
    st.tuples(st.just("reset_peak")),
    st.tuples(st.just("reset_accumulated")),
)


class Addresses:
    """Addresses as (segment, offset), segments numbered as first seen: the
    runtime's memory lies elsewhere in each run."""

    def __init__(self):
        self.segments, self.made = {}, 0

    def __call__(self, ptr):
        if ptr == 0:
            return None
        base, _ = shim.base_allocation(ptr)
        if base not in self.segments:
            self.segments[base], self.made = self.made, self.made + 1
        return self.segments[base], ptr - base

    def forget_released(self):
        """After empty_cache (the only release here): a later segment may get a released one's address."""
        held = {b["segment"] for b in shim.block_records()}
        self.segments = {base: n for base, n in self.segments.items() if base in held}


def run(ops, policy, merge_every_step):
    shim.reset()
    shim.set_policy(policy)
    where = Addresses()
    live, handed_out, read = [], [], []  # live: (ptr, size, stream), oldest first; read: statistics read midway
    unplaced = []  # addresses handed out, placed in their segments only before a release or at the end:
    # placing one is an entry point (base_allocation), and the repeated pair's path runs only without one

    def alloc(size, stream):
        ptr = shim.alloc(size, 0, stream)
        unplaced.append(ptr)
        live.append((ptr, size, stream))

    def place():
        handed_out.extend(where(ptr) for ptr in unplaced)
        unplaced.clear()

    for o in ops:
        kind = o[0]
        if kind == "alloc":
            alloc(o[1], o[2])
        elif kind == "free" and live:
            ptr, size, stream = live.pop(o[1] % len(live))
            shim.free(ptr, size, 0, stream)
        elif kind == "pair" and live:
            ptr, size, stream = live.pop()
            shim.free(ptr, size, 0, stream)
            if merge_every_step:
                check_invariants()
            alloc(size if o[1] is None else o[1], stream)
        elif kind == "record_stream" and live:
            ptr, _, stream = live[o[1] % len(live)]
            shim.record_stream(ptr, S2 if stream == S1 else S1)
        elif kind == "complete":
            shim.sim.complete_all()
        elif kind == "process":
            shim.process_events()
        elif kind == "empty_cache":
            place()
            shim.empty_cache()  # (merges an unmerged block first: so may block_records)
            where.forget_released()
        elif kind == "read_stats":
            read.append({k: v for k, v in shim.stats().items() if k != "unmerged_reuses"})
        elif kind == "reset_peak":
            shim.reset_peak()
        elif kind == "reset_accumulated":
            shim.reset_accumulated()
        if merge_every_step:
            check_invariants()
    place()
    stats = shim.stats()
    blocks = sorted((where(b["address"]), b["size"], b["requested"], b["state"], b["events"], b["stream"])
                    for b in shim.block_records())
    check_invariants()
    return handed_out, blocks, stats, shim.findings(), read


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(op, max_size=40), st.sampled_from(["poll", "stream_wait", "lazy_wait"]))
def test_the_shortcut_changes_no_outcome(sim_shim, ops, policy):
    compare(run(ops, policy, merge_every_step=False), run(ops, policy, merge_every_step=True))


def compare(fast, slow):
    assert slow[2]["unmerged_reuses"] == 0  # the checker merged before every allocation
    assert fast[0] == slow[0], "other addresses handed out"
    assert fast[1] == slow[1], "other blocks"
    assert {k: v for k, v in fast[2].items() if k != "unmerged_reuses"} == {
        k: v for k, v in slow[2].items() if k != "unmerged_reuses"}
    assert fast[3] == slow[3]
    assert fast[4] == slow[4], "other statistics read midway"


def test_pairs_in_every_spot_of_a_segment_end_as_without_the_shortcut(sim_shim):
    # the freed block first in its segment or behind a live one; its cached successor
    # the segment's last block or before a live one; small and large pools
    ops = [("alloc", 4096, S1), ("pair", None), ("pair", None), ("alloc", 8192, S1), ("pair", None),
           ("alloc", 512, S1), ("free", 1), ("pair", None), ("pair", 4096), ("alloc", 3 << 20, S1),
           ("pair", None), ("alloc", 3 << 20, S1), ("free", 3), ("pair", None), ("pair", 100_000)]
    # first in its segment, its cached successor before a live block: x y z | free y, free x, alloc
    first = [("alloc", 4096, S1), ("alloc", 4096, S1), ("alloc", 4096, S1), ("free", 1), ("free", 0),
             ("alloc", 4096, S1), ("pair", None)]
    for sequence, shortcuts in ((ops, 5), (first, 2)):
        fast = run(sequence, "lazy_wait", merge_every_step=False)
        slow = run(sequence, "lazy_wait", merge_every_step=True)
        assert fast[2]["unmerged_reuses"] >= shortcuts
        compare(fast, slow)


def test_a_cached_pair_takes_the_shortcut_and_keeps_the_statistics(sim_shim):
    ptr = shim.alloc(4096, 0, S1)
    shim.free(ptr, 4096, 0, S1)
    before = shim.stats()
    for _ in range(100):
        assert shim.alloc(4096, 0, S1) == ptr
        shim.free(ptr, 4096, 0, S1)
    s = shim.stats()
    # reading the statistics merged the first free's block: its allocation searched as usual
    assert s["unmerged_reuses"] == 99 and s["cache_hits"] == before["cache_hits"] + 100
    # as torch counts a split and its merge, 100 times over
    for key in ("inactive_split_bytes.all", "allocated_bytes.all", "requested_bytes.all", "allocation.all"):
        assert s[f"{key}.current"] == before[f"{key}.current"], key
        assert s[f"{key}.allocated"] - before[f"{key}.allocated"] == s[f"{key}.freed"] - before[f"{key}.freed"], key
    assert s["allocation.all.allocated"] - before["allocation.all.allocated"] == 100
    assert s["inactive_split.all.allocated"] - before["inactive_split.all.allocated"] == 100
    check_invariants()


def test_a_smaller_cached_block_wins_over_the_unmerged_one(sim_shim):
    # an 8 KiB block is cached on its own (its neighbour is live); then 4 KiB is freed in
    # front of the segment's cached rest: best fit for 4 KiB is the 8 KiB block, not the
    # merged 4 KiB + rest
    a = shim.alloc(8192, 0, S1)
    keep = shim.alloc(512, 0, S1)
    small = shim.alloc(4096, 0, S1)
    shim.free(a, 8192, 0, S1)
    shim.free(small, 4096, 0, S1)
    got = shim.alloc(4096, 0, S1)
    assert got == a and shim.stats()["unmerged_reuses"] == 0
    assert shim.alloc(4096, 0, S1) == a + 4096
    check_invariants()
    del keep


def test_a_pending_claim_comes_before_the_unmerged_block(sim_shim):
    a = shim.alloc(1 << 20, 0, S1)
    keep = shim.alloc(512, 0, S1)
    b = shim.alloc(4096, 0, S1)
    shim.free(a, 1 << 20, 0, S1)  # cached on its own (its successor is live), larger than b + the rest
    shim.claim_next(a)
    shim.free(b, 4096, 0, S1)  # left unmerged: its successor is the segment's cached rest, the best fit
    assert shim.alloc(4096, 0, S1) == a
    assert shim.stats()["unmerged_reuses"] == 0
    check_invariants()
    del keep, b


# ---- issue 37, item 11: the walks on the hot path --------------------------------------------------------

def test_an_event_poll_keeps_only_streams_with_pending_events(sim_shim):
    """Each poll walked every stream ever seen (an empty FIFO stayed per
    stream); now a stream's FIFO goes once its last event fired, which the
    invariant checker states (before: 'keeps an empty event FIFO')."""
    streams = [0x7000 + 16 * i for i in range(40)]
    blocks = []
    for s in streams:
        p = sim_shim.alloc(4096, 0, S1)
        sim_shim.record_stream(p, s)
        sim_shim.sim.launch(s)
        sim_shim.free(p, 4096, 0, S1)
        blocks.append(p)
    assert sim_shim.stats()["pending.all.current"] == len(streams)
    for s in streams[:-1]:
        sim_shim.sim.complete(s)
    sim_shim.process_events()
    assert sim_shim.stats()["pending.all.current"] == 1
    check_invariants()
    sim_shim.sim.complete(streams[-1])
    sim_shim.process_events()
    assert sim_shim.stats()["pending.all.current"] == 0
    check_invariants()


def test_an_expandable_segments_last_block_is_kept_through_growth_and_shrinking(sim_shim):
    """Found in O(1) (Segment::last) where every block was walked; the
    checker states that it names the real last block after each step."""
    sim_shim.set_expandable_segments(True)
    try:
        live = []
        for size in (3 << 20, 5 << 20, 1 << 20, 7 << 20, 2 << 20):
            live.append((sim_shim.alloc(size, 0, S1), size))
            check_invariants()
        for p, size in live[1::2] + live[::2]:
            sim_shim.free(p, size, 0, S1)
            check_invariants()
            sim_shim.empty_cache()
            check_invariants()
    finally:
        sim_shim.set_expandable_segments(False)
    assert sim_shim.findings() == []
