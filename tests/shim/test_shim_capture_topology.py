"""The simulated runtime's graph captures (allocator_shim/src/sim_capture_graph.h):
the capture graph that stream order and event record/wait build during a
capture, as CUDA's stream capture builds it, seen through the capture
topology calls the allocator asks (capture_info, node_parents)."""
from conftest import S1, S2, S3

S4 = 0x4000


def frontier(shim, stream):
    return shim.sim.capture_frontier(stream)[1]


def capture_of(shim, stream):
    return shim.sim.capture_frontier(stream)[0]


def test_captured_work_on_one_stream_is_a_chain(sim_shim):
    assert capture_of(sim_shim, S1) == 0
    sim_shim.sim.set_capturing(S1, True)
    assert capture_of(sim_shim, S1) != 0 and frontier(sim_shim, S1) == []
    sim_shim.sim.launch(S1)
    [n1] = frontier(sim_shim, S1)
    sim_shim.sim.launch(S1)
    [n2] = frontier(sim_shim, S1)
    assert n1 != n2
    assert sim_shim.sim.node_parents(n1) == [] and sim_shim.sim.node_parents(n2) == [n1]


def test_an_event_forks_a_stream_into_the_capture_and_another_joins_it_back(sim_shim):
    sim_shim.sim.set_capturing(S1, True)
    sim_shim.sim.launch(S1)
    [root] = frontier(sim_shim, S1)
    sim_shim.sim.wait_event(S2, sim_shim.sim.record_event(S1))  # fork
    assert capture_of(sim_shim, S2) == capture_of(sim_shim, S1)
    assert frontier(sim_shim, S2) == [root]
    sim_shim.sim.launch(S2)
    [on_s2] = frontier(sim_shim, S2)
    sim_shim.sim.launch(S1)
    [on_s1] = frontier(sim_shim, S1)
    assert sim_shim.sim.node_parents(on_s2) == [root] and sim_shim.sim.node_parents(on_s1) == [root]
    sim_shim.sim.wait_event(S1, sim_shim.sim.record_event(S2))  # join
    assert sorted(frontier(sim_shim, S1)) == sorted([on_s1, on_s2])
    sim_shim.sim.launch(S1)
    [sink] = frontier(sim_shim, S1)
    assert sorted(sim_shim.sim.node_parents(sink)) == sorted([on_s1, on_s2])


def test_an_event_record_adds_no_node(sim_shim):
    sim_shim.sim.set_capturing(S1, True)
    sim_shim.sim.launch(S1)
    before = frontier(sim_shim, S1)
    sim_shim.sim.record_event(S1)
    assert frontier(sim_shim, S1) == before


def test_ending_the_capture_on_one_stream_ends_it_for_every_stream_in_it(sim_shim):
    sim_shim.sim.set_capturing(S1, True)
    sim_shim.sim.wait_event(S2, sim_shim.sim.record_event(S1))
    sim_shim.sim.set_capturing(S3, True)  # a capture of its own
    sim_shim.sim.set_capturing(S1, False)
    assert capture_of(sim_shim, S1) == 0 and capture_of(sim_shim, S2) == 0
    assert capture_of(sim_shim, S3) != 0
    sim_shim.sim.set_capturing(S1, True)  # a new capture: a new id
    assert capture_of(sim_shim, S1) not in (0, capture_of(sim_shim, S3))


def test_events_of_no_capture_or_of_another_capture_add_no_dependency(sim_shim):
    outside = sim_shim.sim.record_event(S4)  # recorded before any capture
    sim_shim.sim.set_capturing(S1, True)
    sim_shim.sim.launch(S1)
    mine = frontier(sim_shim, S1)
    sim_shim.sim.wait_event(S1, outside)
    assert frontier(sim_shim, S1) == mine
    sim_shim.sim.set_capturing(S3, True)
    sim_shim.sim.launch(S3)
    sim_shim.sim.wait_event(S1, sim_shim.sim.record_event(S3))  # capture isolation: refused
    assert frontier(sim_shim, S1) == mine
    waits = sim_shim.sim.stream_waits(S1)
    assert waits == 1  # only the wait on the outside event was queued


def test_an_event_recorded_again_outside_the_capture_forks_nothing(sim_shim):
    sim_shim.sim.set_capturing(S1, True)
    sim_shim.sim.launch(S1)
    sim_shim.sim.set_capturing(S1, False)
    e = sim_shim.sim.record_event(S1)  # after the capture
    sim_shim.sim.wait_event(S2, e)
    assert capture_of(sim_shim, S2) == 0


def test_reset_forgets_every_capture(sim_shim):
    sim_shim.sim.set_capturing(S1, True)
    sim_shim.sim.launch(S1)
    [node] = frontier(sim_shim, S1)
    sim_shim.reset()
    sim_shim.select_runtime("sim")
    assert capture_of(sim_shim, S1) == 0
    assert sim_shim.sim.node_parents(node) == []
