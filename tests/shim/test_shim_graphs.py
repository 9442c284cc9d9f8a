"""Graph capture under the shim (simulated runtime): private pools, frees
during a capture, and no event queried or recorded inside a capture.
The torch side (torch.cuda.graph, cudagraph trees) runs in test_gpu_graphs.py."""
import ctypes

import pytest
from conftest import S1, S2

from npu_lifetime import shim
from npu_lifetime.shim.libnpl import library
from helpers.shim_testing import check_invariants, sim_calls

POOL = (7, 0)


def begin(shim, stream=S1, pool=POOL):
    shim.begin_allocate_to_pool(0, pool, stream)
    shim.sim.set_capturing(stream, True)


def end(shim, stream=S1, pool=POOL):
    shim.sim.set_capturing(stream, False)
    shim.end_allocate_to_pool(0, pool)


def test_a_temporary_freed_in_a_capture_is_not_handed_to_an_eager_tensor(sim_shim):
    begin(sim_shim)
    t = sim_shim.alloc(4096, 0, S1)
    sim_shim.free(t, 4096, 0, S1)
    end(sim_shim)
    eager = sim_shim.alloc(4096, 0, S1)
    assert eager != t  # the graph replays writes to t


def test_an_eagerly_cached_block_is_not_handed_into_a_capture(sim_shim):
    e = sim_shim.alloc(4096, 0, S1)
    sim_shim.free(e, 4096, 0, S1)
    begin(sim_shim)
    inside = sim_shim.alloc(4096, 0, S1)
    end(sim_shim)
    assert inside != e
    assert sim_shim.alloc(4096, 0, S1) == e  # eager memory stays eager


def test_memory_freed_inside_a_capture_is_reused_inside_it(sim_shim):
    begin(sim_shim)
    a = sim_shim.alloc(4096, 0, S1)
    sim_shim.free(a, 4096, 0, S1)
    assert sim_shim.alloc(4096, 0, S1) == a
    end(sim_shim)


def test_a_later_capture_into_the_same_pool_reuses_its_blocks(sim_shim):
    begin(sim_shim)
    a = sim_shim.alloc(4096, 0, S1)
    end(sim_shim)
    sim_shim.free(a, 4096, 0, S1)  # an output freed after the capture
    assert sim_shim.alloc(4096, 0, S1) != a
    begin(sim_shim)
    assert sim_shim.alloc(4096, 0, S1) == a
    end(sim_shim)


def test_streams_the_capture_does_not_claim_stay_eager(sim_shim):
    e = sim_shim.alloc(4096, 0, S2)
    sim_shim.free(e, 4096, 0, S2)
    begin(sim_shim, stream=S1)
    assert sim_shim.alloc(4096, 0, S2) == e
    end(sim_shim)


def test_pool_live_allocations_answer_the_cudagraph_trees_check(sim_shim):
    begin(sim_shim)
    a, b = sim_shim.alloc(100, 0, S1), sim_shim.alloc(3 << 20, 0, S1)
    c = sim_shim.alloc(100, 0, S1)
    sim_shim.free(c, 100, 0, S1)
    end(sim_shim)
    sim_shim.alloc(100, 0, S1)  # eager: not in the pool
    assert sorted(sim_shim.pool_live_allocations(0, POOL)) == sorted([a, b])
    assert sim_shim.pool_live_allocations(0, (99, 0)) == []


def test_a_released_pool_gives_its_segments_back(sim_shim):
    begin(sim_shim)
    a = sim_shim.alloc(4096, 0, S1)
    end(sim_shim)
    reserved = sim_shim.stats()["reserved_bytes.all.current"]
    sim_shim.empty_cache()  # the graph still holds a reference: nothing goes
    assert sim_shim.stats()["reserved_bytes.all.current"] == reserved
    sim_shim.release_pool(0, POOL)
    assert sim_shim.stats()["reserved_bytes.all.current"] == reserved  # a is still live
    sim_shim.free(a, 4096, 0, S1)  # the last block of a released pool: cached (a free never returns memory)
    assert sim_shim.stats()["reserved_bytes.all.current"] == reserved
    sim_shim.empty_cache()  # its segment goes here (issue 37: it went from the free before)
    assert sim_shim.stats()["reserved_bytes.all.current"] == 0


def test_new_segments_during_a_capture_belong_to_its_pool(sim_shim):
    begin(sim_shim)
    big = sim_shim.alloc(64 << 20, 0, S1)
    end(sim_shim)
    [seg] = [s for s in sim_shim.snapshot()["segments"] if s["address"] == big]
    assert tuple(seg["graph_pool"]) == POOL


def test_a_free_during_a_capture_records_no_event_until_it_ends(sim_shim):
    x = sim_shim.alloc(4096, 0, S1)  # eager, used on S2
    sim_shim.record_stream(x, S2)
    recorded = sim_shim.stats()["events_recorded"]
    begin(sim_shim)
    sim_shim.sim.set_capturing(S2, True)
    sim_shim.free(x, 4096, 0, S1)  # during the capture: its event would be captured
    assert sim_shim.stats()["events_recorded"] == recorded
    assert sim_shim.stats()["capture_deferred_frees"] == 1
    sim_shim.sim.set_capturing(S2, False)
    end(sim_shim)
    sim_shim.process_events()  # no capture underway: the deferred free records its event now
    assert sim_shim.stats()["events_recorded"] == recorded + 1
    assert sim_shim.alloc(4096, 0, S1) != x  # held until S2 passes that event
    sim_shim.sim.complete(S2)
    assert sim_shim.alloc(4096, 0, S1) == x


def test_record_use_during_a_capture_falls_back_to_record_stream(sim_shim):
    x = sim_shim.alloc(4096, 0, S1)
    begin(sim_shim)
    recorded = sim_shim.stats()["events_recorded"]
    assert sim_shim.record_use(x, S2)
    assert sim_shim.stats()["events_recorded"] == recorded  # no event inside the graph
    end(sim_shim)
    [block] = [b for s in sim_shim.snapshot()["segments"] for b in s["blocks"] if b["address"] == x]
    assert block["recorded_streams"] == [S2]


def test_no_event_is_queried_while_a_capture_is_underway(acl_shim):
    from npu_lifetime import shim

    x = shim.alloc(4096, 0, S1)
    shim.record_use(x, S2)
    shim.free(x, 4096, 0, S1)  # pending under poll
    queries = acl_shim.fake_acl_calls(b"aclrtQueryEventStatus")
    shim.begin_allocate_to_pool(0, POOL, S1)
    shim.alloc(4096, 0, S1)
    shim.alloc(4096, 0, S2)  # an eager allocation on another stream, during the capture
    shim.process_events()
    shim.empty_cache()
    assert acl_shim.fake_acl_calls(b"aclrtQueryEventStatus") == queries
    shim.end_allocate_to_pool(0, POOL)
    shim.process_events()
    assert acl_shim.fake_acl_calls(b"aclrtQueryEventStatus") > queries


def test_claim_takes_exactly_the_cached_memory_asked_for(sim_shim):
    # how a cudagraph-tree pool checkpoint is restored through torch
    a = sim_shim.alloc(4096, 0, S1)
    b = sim_shim.alloc(4096, 0, S1)
    sim_shim.free(a, 4096, 0, S1)
    sim_shim.free(b, 4096, 0, S1)  # a and b merge into one free block
    sim_shim.claim_next(b)
    assert sim_shim.alloc(4096, 0, S1) == b
    assert sim_shim.alloc(4096, 0, S1) == a  # the front stayed cached
    with pytest.raises(ValueError, match="no cached block"):
        sim_shim.claim_next(b)  # b is live: nothing to claim, and the next allocation is left alone
    assert sim_shim.alloc(4096, 0, S1) not in (0, a, b)
    assert sim_shim.findings() == []
    library().npl_claim_next(b)  # the C entry point torch's restore uses reports it at the allocation
    assert sim_shim.alloc(4096, 0, S1) == 0
    assert [f["kind"] for f in sim_shim.findings()] == ["invalid_argument"]


def test_ending_or_releasing_a_pool_never_begun_is_a_finding(sim_shim):
    sim_shim.end_allocate_to_pool(0, (42, 0))
    sim_shim.release_pool(0, (42, 0))
    assert [(f["kind"], f["op"]) for f in sim_shim.findings()] == [
        ("invalid_argument", "end_allocate_to_pool"), ("invalid_argument", "release_pool")]


def test_a_mem_pool_reference_without_a_capture_counts_and_releases(sim_shim):
    assert sim_shim.pool_use_count(0, POOL) == 0
    sim_shim.create_or_incref_pool(0, POOL)  # torch.cuda.MemPool()
    sim_shim.begin_allocate_to_pool(0, POOL, S1)  # use_mem_pool
    a = sim_shim.alloc(4096, 0, S1)
    sim_shim.end_allocate_to_pool(0, POOL)
    sim_shim.release_pool(0, POOL)
    assert sim_shim.pool_use_count(0, POOL) == 1
    assert sim_shim.alloc(4096, 0, S1) != a  # the pool's memory stays the pool's
    sim_shim.free(a, 4096, 0, S1)
    reserved = sim_shim.stats(0)["reserved_bytes.all.current"]
    sim_shim.release_pool(0, POOL)  # the MemPool goes
    assert sim_shim.pool_use_count(0, POOL) == 0
    assert sim_shim.stats(0)["reserved_bytes.all.current"] < reserved


def test_emptying_a_pools_cache_keeps_every_other_segment(sim_shim):
    """torch's test_mempool_empty_cache: ~MemPool releases its pool, then
    empties that pool's cache (emptyCache(id)).  Before, the bridge's
    emptyCache(id) emptied the whole cache: no segment was left, the eager
    one included.  As torch's, a pool still referenced keeps its segments."""
    def use_mem_pool(pool):  # torch.cuda.use_mem_pool: a reference while allocating to it
        sim_shim.begin_allocate_to_pool(0, pool, 0)
        p = sim_shim.alloc(1 << 22, 0, S1)
        sim_shim.end_allocate_to_pool(0, pool)
        sim_shim.release_pool(0, pool)
        return p

    eager = sim_shim.alloc(1 << 22, 0, S1)
    other = (8, 0)
    for pool in (POOL, other):
        sim_shim.create_or_incref_pool(0, pool)  # torch.cuda.MemPool()
        sim_shim.free(use_mem_pool(pool), 1 << 22, 0, S1)  # cached in its pool
    sim_shim.free(eager, 1 << 22, 0, S1)  # cached, eager
    assert sim_shim.stats(0)["segment.all.current"] == 3
    sim_shim.empty_pool_cache(0, other)  # still referenced: nothing goes
    assert sim_shim.stats(0)["segment.all.current"] == 3
    sim_shim.release_pool(0, POOL)  # del pool
    sim_shim.empty_pool_cache(0, POOL)
    s = sim_shim.stats(0)
    assert (s["segment.all.current"], s["num_device_free"]) == (2, 1)
    assert sim_shim.alloc(1 << 22, 0, S1) == eager  # the eager cache is intact
    check_invariants()


def test_nested_pools_allocate_to_the_innermost(sim_shim):
    """torch's test_nested_mempool: use_mem_pool inside use_mem_pool.
    Before, every allocation went to the outermost pool."""
    pools = [(11, 0), (12, 0), (13, 0)]
    owner = {}

    def allocate(pool):
        p = sim_shim.alloc(20 * (1 << 20), 0, S1)
        owner[p] = pool

    sim_shim.begin_allocate_to_pool(0, pools[0], 0)
    allocate(pools[0])
    sim_shim.begin_allocate_to_pool(0, pools[1], 0)
    allocate(pools[1])
    sim_shim.begin_allocate_to_pool(0, pools[2], 0)
    allocate(pools[2])
    sim_shim.end_allocate_to_pool(0, pools[2])
    allocate(pools[1])
    sim_shim.end_allocate_to_pool(0, pools[1])
    allocate(pools[0])
    sim_shim.end_allocate_to_pool(0, pools[0])
    for pool in pools:
        live = set(sim_shim.pool_live_allocations(0, pool))
        assert live == {p for p, o in owner.items() if o == pool}


SEGMENT_ALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
SEGMENT_FREE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)


def test_a_pool_with_an_allocator_of_its_own_takes_its_segments_from_it(sim_shim):
    """torch.cuda.MemPool(allocator) (test_mempool_with_allocator,
    test_tensor_delete_after_allocator_delete): the pool's segments come from
    its allocator and go back to it, even once the pool is gone; other
    pools and eager allocations keep the runtime's.  Before, the bridge
    refused such a pool."""
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    given, returned = [], []

    @SEGMENT_ALLOC
    def alloc(size, device, stream, ctx):
        p = libc.malloc(size)
        given.append((p, size))
        return p

    @SEGMENT_FREE
    def free(ptr, size, device, stream, ctx):
        returned.append((ptr, size))
        libc.free(ptr)

    sim_shim.create_or_incref_pool(0, POOL)  # torch.cuda.MemPool(allocator)
    library().npl_set_pool_allocator(0, POOL[0], POOL[1], ctypes.cast(alloc, ctypes.c_void_p),
                                     ctypes.cast(free, ctypes.c_void_p), None)
    runtime_allocs = sim_calls("malloc")
    sim_shim.begin_allocate_to_pool(0, POOL, 0)
    p = sim_shim.alloc(1 << 20, 0, S1)
    sim_shim.end_allocate_to_pool(0, POOL)
    sim_shim.release_pool(0, POOL)
    assert len(given) == 1 and given[0][0] <= p < given[0][0] + given[0][1]
    eager = sim_shim.alloc(1 << 20, 0, S1)  # not the pool's: the runtime's
    assert len(given) == 1 and not given[0][0] <= eager < given[0][0] + given[0][1]
    sim_shim.release_pool(0, POOL)  # the MemPool goes; its tensor lives on
    assert returned == []
    sim_shim.free(p, 1 << 20, 0, S1)  # the pool's last block: cached, as torch's free never returns memory
    assert returned == []
    sim_shim.empty_cache()  # (issue 37) its segment goes back to its allocator there
    assert returned == given
    sim_shim.free(eager, 1 << 20, 0, S1)
    assert sim_calls("malloc") == runtime_allocs + 1  # the eager segment only
    library().npl_set_pool_allocator(0, 9, 0, ctypes.cast(alloc, ctypes.c_void_p), None, None)
    assert [f["kind"] for f in sim_shim.findings()] == ["invalid_argument"]
    check_invariants()


def test_block_records_match_the_snapshot(sim_shim):
    begin(sim_shim)
    in_pool = sim_shim.alloc(4096, 0, S1)
    end(sim_shim)
    live = sim_shim.alloc(1000, 0, S2)
    freed = sim_shim.alloc(8192, 0, S2)
    sim_shim.free(freed, 8192, 0, S2)
    records = sim_shim.block_records()
    blocks = {b["address"]: b for seg in sim_shim.snapshot()["segments"] for b in seg["blocks"]}
    assert {r["address"] for r in records} == set(blocks)
    by_address = {r["address"]: r for r in records}
    assert (by_address[in_pool]["pool_id0"], by_address[in_pool]["pool_id1"]) == POOL
    assert by_address[live]["requested"] == 1000 and sim_shim.BLOCK_STATES[by_address[live]["state"]] == "live"
    assert sim_shim.BLOCK_STATES[by_address[freed]["state"]] == "cached" and by_address[freed]["requested"] == 0
    for r in records:
        assert r["size"] == blocks[r["address"]]["size"]
        assert r["segment"] <= r["address"] < r["segment"] + r["segment_size"]


def _in_pool(shim, pool, size):
    """torch.cuda.use_mem_pool(pool): `size` bytes allocated into it."""
    shim.begin_allocate_to_pool(0, pool, 0)
    try:
        return shim.alloc(size, 0, S1)
    finally:
        shim.end_allocate_to_pool(0, pool)
        shim.release_pool(0, pool)


MB = 1 << 20


def test_an_eager_allocation_about_to_fail_takes_a_use_on_oom_pools_cached_block(sim_shim):
    """torch's test_mempool_limited_memory_with_allocator.  Before, the bridge
    refused MemPool(use_on_oom=True).  As torch's: the eager request that
    would run out of memory takes the cached block of the use_on_oom pool,
    never of a plain pool; the block stays that pool's."""
    plain, lender = (21, 0), (22, 0)
    for pool in (plain, lender):
        sim_shim.create_or_incref_pool(0, pool)  # torch.cuda.MemPool(...)
    sim_shim.set_pool_use_on_oom(0, lender, True)
    sim_shim.sim.set_memory_limit(88 * MB)
    a, b = _in_pool(sim_shim, plain, 40 * MB), _in_pool(sim_shim, lender, 40 * MB)
    assert a and b
    assert sim_shim.alloc(40 * MB, 0, S1) == 0  # out of memory: both pools' blocks are live
    sim_shim.free(a, 40 * MB, 0, S1)
    sim_shim.free(b, 40 * MB, 0, S1)
    c = sim_shim.alloc(30 * MB, 0, S1)
    assert c == b, sim_shim.last_oom_message()  # the lender's block served it
    assert sim_shim.alloc(30 * MB, 0, S1) == 0  # the plain pool never lends
    assert set(sim_shim.pool_live_allocations(0, lender)) == {c}  # still the lender's
    sim_shim.free(c, 30 * MB, 0, S1)
    assert _in_pool(sim_shim, lender, 20 * MB) == c  # back in the lender, usable as before
    check_invariants()


def test_a_released_use_on_oom_pool_lends_nothing(sim_shim):
    """torch's test_deleted_mempool_not_used_on_oom: ~MemPool turns
    use_on_oom off and drops its reference; a pool gone never lends, a live
    one still does."""
    sim_shim.sim.set_memory_limit(48 * MB)
    for i in range(10):
        pool = (30 + i, 0)
        sim_shim.create_or_incref_pool(0, pool)
        sim_shim.set_pool_use_on_oom(0, pool, True)
        sim_shim.free(_in_pool(sim_shim, pool, 40 * MB), 40 * MB, 0, S1)
        sim_shim.set_pool_use_on_oom(0, pool, False)  # ~MemPool
        sim_shim.release_pool(0, pool)
        sim_shim.empty_pool_cache(0, pool)
    live = (50, 0)
    sim_shim.create_or_incref_pool(0, live)
    sim_shim.set_pool_use_on_oom(0, live, True)
    sim_shim.free(_in_pool(sim_shim, live, 40 * MB), 40 * MB, 0, S1)
    b, c = sim_shim.alloc(20 * MB, 0, S1), sim_shim.alloc(20 * MB, 0, S1)
    assert b and c, sim_shim.last_oom_message()
    assert set(sim_shim.pool_live_allocations(0, live)) == {b, c}
    sim_shim.free(b, 20 * MB, 0, S1)  # cached in the pool (its segment stays: c is live)
    sim_shim.release_pool(0, live)  # the pool goes
    assert sim_shim.alloc(20 * MB, 0, S1) == 0  # a pool without references lends nothing
    check_invariants()


def test_a_no_split_pool_keeps_one_block_per_segment(sim_shim):
    """torch's test_mempool_no_split.  Before, the bridge refused
    MemPool(no_split=True).  A split pool carves its second 4 MiB from the
    first segment; a no_split pool opens a segment per allocation."""
    split_pool, whole = (61, 0), (62, 0)
    for pool in (split_pool, whole):
        sim_shim.create_or_incref_pool(0, pool)
    sim_shim.set_pool_no_split(0, whole)
    for pool in (split_pool, whole):
        assert _in_pool(sim_shim, pool, 4 * MB) and _in_pool(sim_shim, pool, 4 * MB)

    def segments(pool):
        out: dict = {}
        for r in sim_shim.block_records():
            if (r["pool_id0"], r["pool_id1"]) == pool:
                out.setdefault(r["segment"], []).append(r)
        return out

    assert len(segments(split_pool)) == 1 and len(segments(split_pool)[next(iter(segments(split_pool)))]) == 3
    assert len(segments(whole)) == 2
    assert all(len(blocks) == 1 for blocks in segments(whole).values())
    check_invariants()


def test_a_use_on_oom_pool_that_a_capture_allocates_into_lends_nothing(sim_shim):
    """(review) torch's fallback opens each use_on_oom pool and refuses one
    already open.  Before, the shim lent the pool's cached block to an eager
    allocation while a capture on another stream allocated into the pool:
    the block could go to both, and the graph's replays write it."""
    lender = (71, 0)
    sim_shim.create_or_incref_pool(0, lender)
    sim_shim.set_pool_use_on_oom(0, lender, True)
    sim_shim.sim.set_memory_limit(48 * MB)
    cached = _in_pool(sim_shim, lender, 40 * MB)  # on S1
    sim_shim.free(cached, 40 * MB, 0, S1)  # cached in the lender
    begin(sim_shim, S2, lender)  # a capture on S2 allocates into the lender
    assert sim_shim.alloc(30 * MB, 0, S1) == 0  # eager on S1, out of memory: the open pool does not lend
    end(sim_shim, S2, lender)
    assert sim_shim.alloc(30 * MB, 0, S1) == cached  # closed again: it lends
    check_invariants()


def _libc_pool_allocator(on_alloc=None, on_free=None):
    """A pool allocator on libc's malloc/free (torch.cuda.MemPool(allocator)),
    calling on_alloc(size) / on_free() first; set on POOL, which is created.
    Returns the callbacks, to keep alive."""
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]

    @SEGMENT_ALLOC
    def alloc(size, device, stream, ctx):
        if on_alloc is not None:
            on_alloc(size)
        return libc.malloc(size)

    @SEGMENT_FREE
    def free(ptr, size, device, stream, ctx):
        if on_free is not None:
            on_free()
        libc.free(ptr)

    shim.create_or_incref_pool(0, POOL)
    library().npl_set_pool_allocator(0, POOL[0], POOL[1], ctypes.cast(alloc, ctypes.c_void_p),
                                     ctypes.cast(free, ctypes.c_void_p), None)
    return alloc, free


def test_a_released_pools_allocator_frees_only_after_the_work_queued_on_its_segment(sim_shim):
    """(issue 37) Freeing a released pool's last block returned its segment
    from inside npl_free, to the pool allocator's free, while a kernel was
    still queued on it.  Now the segment goes at empty_cache, after its
    stream ran to its end."""
    queued_at_free = []
    keep = _libc_pool_allocator(on_free=lambda: queued_at_free.append(sim_shim.sim.incomplete_events()))
    sim_shim.begin_allocate_to_pool(0, POOL, 0)
    p = sim_shim.alloc(1 << 20, 0, S1)
    sim_shim.end_allocate_to_pool(0, POOL)
    sim_shim.release_pool(0, POOL)
    sim_shim.release_pool(0, POOL)  # the MemPool goes too: the pool is freeable
    assert sim_shim.pool_use_count(0, POOL) == 0
    sim_shim.sim.launch(S1)  # a kernel on the memory, still queued
    sim_shim.sim.record_event(S1)  # complete once that kernel ran
    sim_shim.free(p, 1 << 20, 0, S1)
    assert queued_at_free == []  # nothing from the free itself
    sim_shim.empty_cache()
    assert queued_at_free == [0]  # the allocator's free ran after the queued kernel
    check_invariants()
    del keep


def test_the_memory_fraction_applies_to_a_pool_allocators_segments(sim_shim):
    """(issue 37) A MemPool allocator's segments skipped the fraction check;
    torch applies it first."""
    asked = []
    sim_shim.sim.set_memory_limit(1000 << 20)
    sim_shim.set_memory_fraction(0.1, 0)  # 100 MiB
    keep = _libc_pool_allocator(on_alloc=asked.append)
    sim_shim.begin_allocate_to_pool(0, POOL, 0)
    a = sim_shim.alloc(60 << 20, 0, S1)
    b = sim_shim.alloc(60 << 20, 0, S1)  # 120 MiB reserved would pass the fraction
    sim_shim.end_allocate_to_pool(0, POOL)
    assert a != 0 and b == 0
    assert len(asked) == 1  # the pool allocator was not asked for the second
    assert "memory fraction 0.1" in sim_shim.last_oom_message()
    sim_shim.free(a, 60 << 20, 0, S1)
    sim_shim.release_pool(0, POOL)
    sim_shim.release_pool(0, POOL)
    sim_shim.empty_cache()
    sim_shim.set_memory_fraction(1.0, 0)
    del keep
