"""Pictures from the real shim's trace on the simulated runtime, against two
independent oracles: the shim's own final snapshot (which blocks are live
or still held, by generation) and the memory viewer's replay rules."""
import pytest
import torch.cuda._memory_viz as torch_viz
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npu_lifetime.shim import api
from npu_lifetime.viz import lives, memory_viz, timeline
from npu_lifetime.viz.recorder import Recorder
from npu_lifetime.viz.trace import shim_has_trace

pytestmark = pytest.mark.skipif(not shim_has_trace(), reason="this shim build has no allocator trace")

STREAMS = (0x10, 0x20, 0x30)
SIZES = (512, 4096, 300_000, 1 << 20, 3 << 20)

op = st.one_of(
    st.tuples(st.just("alloc"), st.sampled_from(SIZES), st.sampled_from(STREAMS[:2])),
    st.tuples(st.just("free"), st.integers(0, 50)),
    st.tuples(st.sampled_from(["record_use", "record_stream", "note_use", "erase_stream"]), st.integers(0, 50),
              st.sampled_from(STREAMS)),
    st.tuples(st.just("complete"), st.sampled_from(STREAMS)),
    st.tuples(st.just("process_events")),
    st.tuples(st.just("policy"), st.sampled_from(sorted(api.POLICIES))),
    st.tuples(st.just("double_free"), st.integers(0, 50)),
)


def play(ops: list) -> None:
    live, freed = [], []
    for o in ops:
        kind = o[0]
        if kind == "alloc":
            ptr = api.alloc(o[1], 0, o[2])
            if ptr:
                live.append((ptr, o[1], o[2]))
        elif kind == "free" and live:
            ptr, size, stream = live.pop(o[1] % len(live))
            api.free(ptr, size, 0, stream)
            freed.append((ptr, size, stream))
        elif kind == "double_free" and freed:
            ptr, size, stream = freed[o[1] % len(freed)]
            api.free(ptr, size, 0, stream)
        elif kind in ("record_use", "record_stream", "note_use", "erase_stream") and live:
            getattr(api, kind)(live[o[1] % len(live)][0], o[2])
        elif kind == "complete":
            api.sim.complete(o[1])
        elif kind == "process_events":
            api.process_events()
        elif kind == "policy":
            api.set_policy(o[1])


@pytest.fixture
def fresh_sim(sim_shim):
    yield
    api.set_debug(False)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(op, max_size=40), debug=st.booleans())
def test_trace_lives_agree_with_the_shims_snapshot_and_replay_in_the_viewer(fresh_sim, ops, debug):
    api.reset()
    api.select_runtime("sim")
    api.set_policy("poll")
    api.set_debug(debug, quarantine_bytes=2 << 20)
    recorder = Recorder(capacity=1 << 14).start()
    play(ops)
    rec = recorder.stop("random ops")
    api.set_debug(False)
    built = lives.build(rec.events, rec.shim_findings)

    # oracle 1: the shim's snapshot says which owners are live or still held
    by_key = {life.key: life for life in built.blocks}
    in_snapshot = {}
    for seg in rec.snapshot["segments"]:
        for b in seg["blocks"]:
            if b["state"] != "cached":
                in_snapshot[(seg["device"], b["address"], b["generation"])] = b["state"]
    expected = {key: ("live" if state == "live" else "held") for key, state in in_snapshot.items()}
    drawn = {life.key: life.state for life in built.blocks if life.state != "free"}
    assert drawn == expected
    assert all(key in by_key for key in in_snapshot)

    # oracle 2: the viewer's replay, and torch's own reader
    data = memory_viz.build(rec.snapshot, built, rec.frames)
    assert memory_viz.replay_problems(data) == []
    torch_viz.segsum(data)
    timeline.render(built, timeline.Page())


def test_quarantine_shows_as_a_held_window_with_its_poison(fresh_sim):
    api.set_debug(True, quarantine_bytes=3 << 20)
    recorder = Recorder().start()
    a = api.alloc(4096, 0, 0x10)
    api.free(a, 4096, 0, 0x10)  # poisoned, quarantined
    big = api.alloc(3 << 20, 0, 0x10)
    api.free(big, 3 << 20, 0, 0x10)  # pushes a out of the 3 MiB quarantine
    rec = recorder.stop("quarantine")
    api.set_debug(False)
    built = lives.build(rec.events, rec.shim_findings)
    first = built.blocks[0]
    assert [m.kind for m in first.marks] == ["poison"]
    held = first.held_until(built.end)
    assert held is not None and held > first.marks[0].index > first.free  # left quarantine after its poison
    assert first.state == "free"
    assert built.blocks[1].state == "held"  # the big block is still in quarantine
    data = memory_viz.build(rec.snapshot, built, rec.frames)
    assert memory_viz.replay_problems(data) == []
