"""graph_capture_record_stream_reuse against an independent oracle: random
fork / join / kernel / record_stream / free / alloc schedules during one
graph capture on the simulated runtime, each step checked against a plain
Python model of the capture's graph (a DAG built from stream order and event
record/wait) and its reachability.

After every step the blocks the shim holds back as awaiting_join must be
exactly those the oracle says are not yet joined; every block handed out
must not overlap one still waiting (for the join or the capture's end); and
the allocator's invariants hold.  A block is joined once every marker (the
frontiers, at its free, of its stream and of the streams it was recorded on)
is an ancestor of, or in, its stream's frontier at an allocation on it."""
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npu_lifetime import shim
from shim_testing import check_invariants

STREAMS = (0x1000, 0x2000, 0x3000, 0x4000)
ORIGIN = STREAMS[0]
SIZES = (512, 4096)
POOL = (11, 0)


class Oracle:
    """The capture's graph, in plain Python: node -> parents; per stream its
    frontier (None: not capturing)."""

    def __init__(self):
        self.parents = {}
        self.frontier = {s: None for s in STREAMS}
        self.frontier[ORIGIN] = set()

    def launch(self, stream):
        if self.frontier[stream] is None:
            return
        node = len(self.parents)
        self.parents[node] = set(self.frontier[stream])
        self.frontier[stream] = {node}

    def wait(self, waiter, recorded_on):
        """``waiter`` waits on an event recorded on ``recorded_on`` now."""
        nodes = self.frontier[recorded_on]
        if nodes is None:
            return  # an event of no capture
        self.frontier[waiter] = set(nodes) if self.frontier[waiter] is None else self.frontier[waiter] | nodes

    def at_or_before(self, stream):
        """Every node that is an ancestor of, or in, ``stream``'s frontier."""
        seen, todo = set(), list(self.frontier[stream] or ())
        while todo:
            n = todo.pop()
            if n not in seen:
                seen.add(n)
                todo.extend(self.parents[n])
        return seen


class Blocks:
    """What the caller knows of each tensor and of each freed block."""

    def __init__(self):
        self.live = {}  # ptr -> [size, stream, {recorded streams}]
        self.awaiting = {}  # ptr -> (size, stream, markers)
        self.held = {}  # ptr -> size: deferred to the capture's end

    def free(self, oracle, ptr):
        size, stream, recorded = self.live.pop(ptr)
        if not recorded:
            return  # nothing to wait for: cached at once
        streams = [stream, *recorded]
        if any(oracle.frontier[s] is None for s in streams):
            self.held[ptr] = size
            return
        markers = set().union(*(oracle.frontier[s] for s in streams))
        if markers:
            self.awaiting[ptr] = (size, stream, markers)
        else:
            self.held[ptr] = size

    def before_alloc(self, oracle, stream):
        """The allocation on ``stream`` first takes back what its frontier joined."""
        if oracle.frontier[stream] is None:
            return
        reached = oracle.at_or_before(stream)
        for ptr, (_size, owner, markers) in list(self.awaiting.items()):
            if owner == stream and markers <= reached:
                del self.awaiting[ptr]

    def check_alloc(self, ptr, size):
        for other, (osize, *_rest) in [*self.live.items(), *self.awaiting.items(),
                                       *((p, (s,)) for p, s in self.held.items())]:
            assert ptr + size <= other or other + osize <= ptr, "handed out memory still in use or waiting"


def shim_awaiting():
    return {b["address"] for seg in shim.snapshot()["segments"] for b in seg["blocks"]
            if b["state"] == "awaiting_join"}


op = st.one_of(
    st.tuples(st.just("launch"), st.sampled_from(STREAMS)),
    st.tuples(st.just("wait"), st.sampled_from(STREAMS), st.sampled_from(STREAMS)),
    st.tuples(st.just("alloc"), st.sampled_from(STREAMS), st.sampled_from(SIZES)),
    st.tuples(st.just("record_stream"), st.integers(0, 20), st.sampled_from(STREAMS)),
    st.tuples(st.just("use"), st.integers(0, 20), st.sampled_from(STREAMS)),
    st.tuples(st.just("fork_use"), st.integers(0, 20), st.sampled_from(STREAMS)),
    st.tuples(st.just("free"), st.integers(0, 20)),
)


def step(oracle, blocks, action):
    kind = action[0]
    if kind == "launch":
        shim.sim.launch(action[1])
        oracle.launch(action[1])
    elif kind == "wait":
        waiter, recorded_on = action[1], action[2]
        if waiter != recorded_on:
            shim.sim.wait_event(waiter, shim.sim.record_event(recorded_on))
            oracle.wait(waiter, recorded_on)
    elif kind == "alloc":  # and a kernel writing it (torch.ones)
        stream, size = action[1], action[2]
        blocks.before_alloc(oracle, stream)
        ptr = shim.alloc(size, 0, stream)
        shim.sim.launch(stream)
        oracle.launch(stream)
        assert ptr
        blocks.check_alloc(ptr, size)
        blocks.live[ptr] = [size, stream, set()]
    elif blocks.live:
        ptr = sorted(blocks.live)[action[1] % len(blocks.live)]
        size, owner, recorded = blocks.live[ptr]
        if kind == "fork_use" and action[2] != owner:  # the stream waits for the owner's work first
            shim.sim.wait_event(action[2], shim.sim.record_event(owner))
            oracle.wait(action[2], owner)
        if kind in ("record_stream", "use", "fork_use"):
            if kind != "record_stream":  # a kernel on that stream reading the tensor
                shim.sim.launch(action[2])
                oracle.launch(action[2])
            shim.record_stream(ptr, action[2])
            if action[2] != owner:
                recorded.add(action[2])
        else:
            shim.free(ptr, size, 0, owner)
            blocks.free(oracle, ptr)
    assert shim_awaiting() == set(blocks.awaiting)
    check_invariants()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(actions=st.lists(op, max_size=40))
def test_reuse_inside_a_capture_matches_the_graph_oracle(sim_shim, actions):
    shim.reset()
    shim.select_runtime("sim")
    shim.set_graph_capture_record_stream_reuse(True)
    shim.begin_allocate_to_pool(0, POOL, 0)
    shim.sim.set_capturing(ORIGIN, True)
    oracle, blocks = Oracle(), Blocks()
    for action in actions:
        step(oracle, blocks, action)
    shim.sim.set_capturing(ORIGIN, False)
    shim.end_allocate_to_pool(0, POOL)
    assert shim_awaiting() == set()
    check_invariants()


def test_the_oracle_schedules_do_reach_a_reuse(sim_shim):
    """The property above is not vacuous: a schedule of its alphabet reuses a
    joined block inside the capture."""
    shim.set_graph_capture_record_stream_reuse(True)
    shim.begin_allocate_to_pool(0, POOL, 0)
    shim.sim.set_capturing(ORIGIN, True)
    oracle, blocks = Oracle(), Blocks()
    s2 = STREAMS[1]
    for action in [("alloc", ORIGIN, 512), ("wait", s2, ORIGIN), ("use", 0, s2), ("free", 0),
                   ("alloc", ORIGIN, 512), ("wait", ORIGIN, s2)]:
        step(oracle, blocks, action)
    freed = next(iter(blocks.awaiting))
    step(oracle, blocks, ("alloc", ORIGIN, 512))
    assert freed in blocks.live and not blocks.awaiting
