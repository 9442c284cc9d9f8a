"""Random operation sequences and concurrent threads against the shim, with
its statistics, safety invariants and the allocator's own invariant checker
(npl_check_invariants) run after every step."""
import ctypes
import random
import threading

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npu_lifetime import shim
from helpers.shim_testing import check_invariants, invariant_violations

STREAMS = (0x1000, 0x2000, 0x3000)
SIZES = (1, 512, 4000, 100_000, 1 << 20, 3 << 20)

op = st.one_of(
    st.tuples(st.just("alloc"), st.sampled_from(SIZES), st.sampled_from(STREAMS)),
    st.tuples(st.just("free"), st.integers(0, 30)),
    st.tuples(st.just("record_use"), st.integers(0, 30), st.sampled_from(STREAMS)),
    st.tuples(st.just("record_stream"), st.integers(0, 30), st.sampled_from(STREAMS)),
    st.tuples(st.just("complete"), st.sampled_from(STREAMS)),
    st.tuples(st.just("process")),
    st.tuples(st.just("empty_cache")),
    st.tuples(st.just("reset_accumulated")),
    st.tuples(st.just("reset_peak")),
)


class Tracker:
    """What the caller knows: live blocks, and freed blocks whose reuse must
    wait for streams to progress."""

    def __init__(self):
        self.live = {}  # ptr -> (size, stream, {streams to wait for})
        self.quarantined = {}  # ptr -> (size, {streams})

    def check_alloc(self, ptr, size):
        end = ptr + size
        for other, (osize, *_rest) in self.live.items():
            assert end <= other or other + osize <= ptr, "two live blocks overlap"
        for q, (qsize, deps) in self.quarantined.items():
            if deps:
                assert end <= q or q + qsize <= ptr, "reused before its events fired"


def waiting_blocks():
    """(address, size) of each cached block that carries events."""
    return [(b["address"], b["size"]) for seg in shim.snapshot()["segments"] for b in seg["blocks"]
            if b["state"] == "cached" and b["held_events"]]


def cached_bytes():
    return sum(b["size"] for seg in shim.snapshot()["segments"] for b in seg["blocks"] if b["state"] == "cached")


def check_stats(tracker):
    s = shim.stats()
    assert s["reserved_bytes.all.current"] == (
        s["allocated_bytes.all.current"] + cached_bytes() + s["pending_bytes.all.current"]
    )
    assert s["allocation.all.current"] == len(tracker.live)
    assert s["requested_bytes.all.current"] == sum(v[0] for v in tracker.live.values())
    assert s["allocated_bytes.all.peak"] >= s["allocated_bytes.all.current"]
    assert s["reserved_bytes.all.peak"] >= s["reserved_bytes.all.current"]
    assert s["active_bytes.all.peak"] >= s["allocated_bytes.all.current"] + s["pending_bytes.all.current"]
    check_invariants()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(op, max_size=60), st.sampled_from(["poll", "stream_wait", "lazy_wait"]),
       st.sampled_from(["off", "idle", "always"]))
def test_random_sequences_keep_the_invariants(sim_shim, ops, policy, cross_stream):
    shim.reset()
    shim.set_policy(policy)
    shim.set_cross_stream_reuse(cross_stream)  # another stream's whole free segment: when idle, or behind waits
    t = Tracker()
    order = []  # live pointers in allocation order, for picking by index
    for o in ops:
        kind = o[0]
        if kind == "alloc":
            _, size, stream = o
            before = shim.stats()["stream_waits"]
            waiting = waiting_blocks()
            ptr = shim.alloc(size, 0, stream)
            if policy == "poll":
                t.check_alloc(ptr, size)
            elif shim.stats()["stream_waits"] == before:
                t.check_alloc(ptr, size)  # no GPU-side wait: must not be quarantined memory
            # the split rule: after the wait, the whole cached block it was made for is ordered
            # on its stream (the part handed out and the remainder that stays in that stream's pool)
            start, end = next(((a, a + n) for a, n in waiting if a <= ptr < a + n), (ptr, ptr + size))
            if shim.stats()["stream_waits"] == before:
                start, end = ptr, ptr + size
            for q in [q for q in t.quarantined if start <= q < end]:
                del t.quarantined[q]
            t.live[ptr] = (size, stream, set())
            order.append(ptr)
        elif kind in ("free", "record_use", "record_stream") and order:
            ptr = order[o[1] % len(order)]
            size, stream, deps = t.live[ptr]
            if kind == "free":
                shim.free(ptr, size, 0, stream)
                del t.live[ptr]
                order.remove(ptr)
                t.quarantined[ptr] = (size, deps)
            elif o[2] != stream:
                getattr(shim, kind)(ptr, o[2])
                deps.add(o[2])
        elif kind == "complete":
            shim.sim.complete(o[1])
            for _, _, deps in t.live.values():
                deps.discard(o[1])  # record_use events before now have fired;
            for _, deps in t.quarantined.values():  # record_stream ones fire only after the free
                deps.discard(o[1])
        elif kind == "process":
            shim.process_events()
        elif kind in ("reset_accumulated", "reset_peak"):
            getattr(shim, kind)(0)  # the checker sees every statistic field stay >= 0
        elif kind == "empty_cache":
            shim.empty_cache()  # as torch's: the host waits for every freed block's events first
            for _, deps in t.quarantined.values():
                deps.clear()
        check_stats(t)
    for ptr, (size, stream, _) in t.live.items():
        shim.free(ptr, size, 0, stream)
    shim.sim.complete_all()
    shim.empty_cache()
    check_invariants()
    s = shim.stats()
    assert (s["allocation.all.current"], s["pending.all.current"], s["reserved_bytes.all.current"]) == (0, 0, 0)
    assert shim.findings() == []


def test_threads_never_share_a_block(sim_shim):
    shim.set_policy("poll")
    live, guard, errors = {}, threading.Lock(), []

    def worker(tid):
        rng = random.Random(tid)
        mine = []
        own_stream = 0x10000 * (tid + 1)
        for _ in range(400):
            if mine and rng.random() < 0.5:
                ptr, size, tag, stream = mine.pop(rng.randrange(len(mine)))
                if ctypes.string_at(ptr, size) != bytes([tag]) * size:
                    errors.append(f"thread {tid}: block {ptr:#x} was overwritten")
                with guard:
                    del live[ptr]
                if rng.random() < 0.3:
                    shim.record_use(ptr, STREAMS[rng.randrange(3)])
                shim.free(ptr, size, 0, stream)
                if rng.random() < 0.3:
                    shim.sim.complete(STREAMS[rng.randrange(3)])
                errors.extend(f"thread {tid}: {v}" for v in invariant_violations())
            else:
                size = rng.choice((64, 700, 5000, 70_000))
                stream = own_stream if rng.random() < 0.7 else STREAMS[0]
                ptr = shim.alloc(size, 0, stream)
                stream_ok = ptr != 0
                with guard:
                    for other, osize in live.items():
                        if not (ptr + size <= other or other + osize <= ptr):
                            errors.append(f"thread {tid}: {ptr:#x} handed out twice")
                    live[ptr] = size
                tag = tid + 1
                ctypes.memset(ptr, tag, size)
                if stream_ok:
                    mine.append((ptr, size, tag, stream))
                errors.extend(f"thread {tid}: {v}" for v in invariant_violations())
        for ptr, size, _, stream in mine:
            with guard:
                del live[ptr]
            shim.free(ptr, size, 0, stream)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    shim.sim.complete_all()
    shim.process_events()
    s = shim.stats()
    assert s["allocation.all.allocated"] == s["allocation.all.freed"] and s["allocation.all.current"] == 0
    assert s["pending.all.current"] == 0
    assert s["reserved_bytes.all.current"] == cached_bytes()
    check_invariants()
    assert shim.findings() == []
