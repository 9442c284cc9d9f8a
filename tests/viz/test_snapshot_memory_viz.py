"""The memory-viewer pickle, read back with torch's own reader
(torch.cuda._memory_viz), from the hand-written trace in viz_fixture."""
import pickle
import pickletools

import pytest
import torch.cuda._memory_viz as torch_viz
from helpers import viz_fixture as fx

from npu_lifetime.viz import lives, memory_viz

# every opcode the viewer's own unpickler (torch/utils/viz/MemoryViz.js, `unpickle`) handles
VIEWER_OPCODES = {
    "PROTO", "APPEND", "APPENDS", "LIST", "TUPLE", "NEWFALSE", "NEWTRUE", "NONE", "BINGET", "BININT", "BININT1",
    "BININT2", "EMPTY_DICT", "EMPTY_LIST", "FRAME", "LONG1", "LONG_BINGET", "MARK", "MEMOIZE", "BINPUT",
    "LONG_BINPUT", "SETITEMS", "SETITEM", "DICT", "SHORT_BINUNICODE", "BINUNICODE", "STOP", "EMPTY_TUPLE",
    "TUPLE1", "TUPLE2", "TUPLE3", "BINFLOAT",
}


def identity(lines):  # torch's segments()/memory() would download flamegraph.pl to render
    return lines


@pytest.fixture
def written(tmp_path):
    data = memory_viz.build(fx.snapshot(), lives.build(fx.trace(), fx.findings()), fx.FRAMES, source="fixture")
    path = tmp_path / "snap.pickle"
    memory_viz.write(str(path), data)
    with open(path, "rb") as f:
        return path, pickle.load(f)


def blocks_by_address(data):
    return {b["address"]: b for seg in data["segments"] for b in seg["blocks"]}


def names(frames):
    return [f["name"] for f in frames]


def test_torch_reads_it_back(written):
    _, data = written
    stats = torch_viz.segsum(data)  # asserts that blocks add up to their segments
    assert "segments: 1" in stats and "total_reserved: 2.0MiB" in stats
    text = torch_viz.trace(data)
    assert "cudaMalloc(268435456, 2.0MiB)" in text and "del " in text and "free completed" in text
    assert "stream_16;seg_268435456;active_pending_free;" in torch_viz.segments(data, format_flamegraph=identity)
    assert "active_allocated" in torch_viz.memory(data, format_flamegraph=identity)
    for page in (torch_viz.trace_plot(data), torch_viz.segment_plot(data)):
        assert "add_local_files" in page and "snapshot.pickle" in page


def test_states_sizes_and_segment_totals(written):
    _, data = written
    (seg,) = data["segments"]
    assert (seg["device"], seg["address"], seg["total_size"], seg["stream"]) == (0, fx.SEG, fx.MIB2, fx.C)
    blocks = blocks_by_address(data)
    assert [blocks[a]["state"] for a in (fx.F, fx.B, fx.D)] == ["inactive", "active_allocated", "active_pending_free"]
    assert blocks[fx.B]["requested_size"] == fx.K - 100
    assert (seg["allocated_size"], seg["active_size"], seg["requested_size"]) == (fx.K, 2 * fx.K, fx.K - 100)


def test_each_block_shows_its_streams_and_events_as_frames(written):
    _, data = written
    blocks = blocks_by_address(data)
    live = names(blocks[fx.B]["frames"])
    assert live[0].startswith("b2 (owner 1 of this address): live")
    assert "record_stream(stream 0x20): its free waits for all work queued there by the free" in live
    assert "record_stream(stream 0x30): its free waits for all work queued there by the free" in live
    pending = names(blocks[fx.D]["frames"])
    assert "freed, holding an event of stream 0x20: must fire before reuse" in pending
    assert any("note_use on stream 0x20" in n for n in pending)
    assert any(n.startswith("b3 +4.0 us: finding on stream 0x20: unrecorded_use (free)") for n in pending)


def test_the_viewer_keeps_every_annotation_frame(written):
    _, data = written
    frames = [f for seg in data["segments"] for b in seg["blocks"] for f in b["frames"]]
    frames += [f for e in data["device_traces"][0] for f in e["frames"]]
    assert frames and all(torch_viz._frame_filter(f["name"], f["filename"]) for f in frames)
    assert all(";" not in f["name"] for f in frames)  # torch's flamegraph separator


def test_the_pickle_uses_only_what_the_viewers_unpickler_reads(written):
    path, _ = written
    with open(path, "rb") as f:
        ops = list(pickletools.genops(f.read()))
    assert ops[0][0].name == "PROTO" and 2 <= ops[0][1] <= 4
    assert {op.name for op, _, _ in ops} <= VIEWER_OPCODES


def test_a_free_completes_when_the_block_became_reusable(written):
    _, data = written
    trace = data["device_traces"][0]
    at = {(e["action"], e["addr"], e["time_us"]) for e in trace}
    t = {i: 1000 + i for i in range(len(fx.trace()))}  # time_us of trace position i
    assert ("free_requested", fx.A, t[5]) in at and ("free_completed", fx.A, t[9]) in at  # b1: waited 5 -> 9
    assert ("free_requested", fx.E, t[15]) in at and ("free_completed", fx.E, t[15]) in at  # b4: at once
    d_actions = [e["action"] for e in trace if e["addr"] == fx.D]
    assert "free_requested" in d_actions and "free_completed" not in d_actions  # b3: still waiting


def test_lifetime_calls_are_trace_entries_of_their_own(written):
    _, data = written
    trace = data["device_traces"][0]
    own = [(e["action"], e["stream"], e["version"]) for e in trace if "version" in e]
    assert ("record_use", fx.M, 0) in own and ("record_use", fx.S, 1) in own  # E is A's address, owner 2
    assert ("reuse_wait", fx.C, 2) in own and ("note_use", fx.M, 0) in own
    allocs = [e for e in trace if e["action"] == "alloc"]
    assert allocs[0]["frames"][-1] == fx.FRAMES[1][0]  # the Python frames of the allocation follow the notes
    assert "b1 +1.0 us: record_use on stream 0x20" in " ".join(names(allocs[0]["frames"]))


def test_the_fixture_trace_replays_onto_its_final_state(written):
    _, data = written
    assert memory_viz.replay_problems(data) == []


def _seg(address, size, blocks):
    return {"device": 0, "address": address, "total_size": size, "stream": 0, "blocks": blocks}


def _ev(action, addr, size):
    return {"action": action, "addr": addr, "size": size, "stream": 0, "frames": []}


def test_replay_reports_what_would_break_the_viewer():
    # undoing a free_requested whose block is not active
    data = {"segments": [_seg(0, 64, [{"size": 64, "state": "inactive"}])],
            "device_traces": [[_ev("segment_alloc", 0, 64), _ev("free_requested", 0, 64)]]}
    assert memory_viz.replay_problems(data) == ["device 0, event 1: free_requested of 0x0, no such active block"]
    # a block that was active before its segment existed
    data = {"segments": [_seg(0, 64, [{"size": 64, "state": "active_allocated"}])],
            "device_traces": [[_ev("alloc", 0, 64), _ev("segment_alloc", 0, 64)]]}
    assert memory_viz.replay_problems(data) == ["device 0, after event 0: block(s) 0x0 in no segment"]


def test_without_a_trace_the_pickle_holds_the_final_state():
    data = memory_viz.build(fx.snapshot())
    assert data["device_traces"] == [[]]
    assert blocks_by_address(data)[fx.D]["state"] == "active_pending_free"
    assert torch_viz.segsum(data)


@pytest.mark.parametrize("shim_state, viewer", [("live", "active_allocated"), ("cached", "inactive"),
                                                ("pending", "active_pending_free"),
                                                ("quarantined", "active_pending_free")])
def test_shim_states_in_the_viewers_words(shim_state, viewer):
    assert memory_viz.viewer_state(shim_state) == viewer
