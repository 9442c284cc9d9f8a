"""Block lives rebuilt from a hand-written allocator trace (viz_fixture)."""
import pytest
from helpers import viz_fixture as fx

from npu_lifetime.viz import lives
from npu_lifetime.viz.trace import TraceFormatError, check_events


@pytest.fixture
def built():
    return lives.build(fx.trace(), fx.findings())


def by_name(built, name):
    return next(life for life in built.blocks if life.name == name)


def test_each_owner_of_an_address_is_its_own_life(built):
    assert [(life.name, life.ptr, life.generation) for life in built.blocks] == [
        ("b1", fx.A, 1), ("b2", fx.B, 1), ("b3", fx.D, 1), ("b4", fx.E, 2), ("b5", fx.F, 3)]


def test_alloc_free_pending_and_reusable_positions(built):
    # positions are indices into viz_fixture._STEPS
    b1, b2, b3, b4, b5 = built.blocks
    assert (b1.alloc, b1.free, b1.pending, b1.reusable, b1.state) == (1, 5, 6, 9, "free")
    assert (b2.alloc, b2.free, b2.state) == (3, None, "live")
    assert (b3.alloc, b3.free, b3.pending, b3.reusable, b3.state) == (7, 10, 12, None, "held")
    assert (b4.free, b4.pending, b4.reusable, b4.state) == (15, None, 16, "free")
    assert [(m.kind, m.index) for m in b4.marks] == [("record_use", 14), ("reuse_wait", 17)]
    assert (b5.alloc, b5.free, b5.reusable) == (18, 19, 20)
    assert b1.held_until(built.end) == 9  # freed at 5, reusable at 9
    assert b3.held_until(built.end) == built.end  # still waiting when the trace ends
    assert b4.held_until(built.end) is None  # straight back to the cache


def test_streams_the_free_waits_for(built):
    assert by_name(built, "b1").waited_streams() == [(fx.M, ["record_use"])]
    assert by_name(built, "b2").waited_streams() == [(fx.M, ["record_stream"]), (fx.S, ["record_stream"])]
    assert by_name(built, "b3").waited_streams() == [(fx.M, ["note_use"])]
    assert by_name(built, "b5").waited_streams() == []


def test_erase_stream_withdraws_a_record_stream_and_uses_after_the_free_do_not_count():
    events = [dict(e, t_ns=i) for i, e in enumerate([
        {"kind": "alloc", "ptr": 64, "size": 8, "device": 0, "stream": 1, "alloc_stream": 1, "generation": 1},
        {"kind": "record_stream", "ptr": 64, "size": 8, "device": 0, "stream": 2, "alloc_stream": 1, "generation": 1},
        {"kind": "record_use", "ptr": 64, "size": 8, "device": 0, "stream": 3, "alloc_stream": 1, "generation": 1},
        {"kind": "erase_stream", "ptr": 64, "size": 8, "device": 0, "stream": 2, "alloc_stream": 1, "generation": 1},
        {"kind": "free", "ptr": 64, "size": 8, "device": 0, "stream": 1, "alloc_stream": 1, "generation": 1},
        {"kind": "record_use", "ptr": 64, "size": 8, "device": 0, "stream": 4, "alloc_stream": 1, "generation": 1},
    ])]
    (life,) = lives.build(events).blocks
    assert life.waited_streams() == [(3, ["record_use"])]


def test_findings_get_their_shim_detail_and_unknown_addresses_stay_loose(built):
    texts = [(life.name if life else None, mark.stream, mark.text) for life, mark in built.findings()]
    assert texts[0][:2] == ("b3", fx.M) and texts[0][2].startswith("unrecorded_use (free)")
    assert texts[1][:2] == ("b5", fx.C) and texts[1][2].startswith("double_free (free)")
    assert texts[2][:2] == (None, fx.C) and texts[2][2].startswith("unknown_pointer (free)")
    assert [m.ptr for m in built.loose] == [fx.UNKNOWN]


def test_a_shim_finding_without_a_trace_event_is_kept_without_a_position():
    extra = {"kind": "size_mismatch", "op": "free", "address": 4096, "stream": 0, "detail": "freed 8 B of 16"}
    built = lives.build(fx.trace(), fx.findings() + [extra])
    (life, mark) = built.findings()[-1]
    assert life is None and mark.index is None and "size_mismatch" in mark.text


def test_a_life_that_began_before_the_trace():
    events = [{"t_ns": 5, "kind": "free", "ptr": 64, "size": 8, "device": 0, "stream": 1, "alloc_stream": 1,
               "generation": 4}]
    (life,) = lives.build(events).blocks
    assert life.alloc is None and life.free == 0 and life.generation == 4


def test_every_stream_a_block_touched_is_a_lane(built):
    assert built.streams() == [(0, fx.C), (0, fx.M), (0, fx.S)]


@pytest.mark.parametrize("events, message", [
    ({"kind": "alloc"}, "a list of event dicts"),
    ([("alloc", 1)], "trace event 0 is a tuple"),
    ([{"kind": "alloc", "ptr": 1}], "trace event 0 lacks t_ns, size, device, stream, alloc_stream, generation"),
    ([dict(fx.trace()[0], kind="malloc")], "kind 'malloc'; expected one of segment_alloc"),
    ([dict(fx.trace()[0], ptr="0x10")], "ptr must be integers"),
])
def test_a_malformed_trace_is_a_clear_error(events, message):
    with pytest.raises(TraceFormatError, match=message.replace("(", r"\(")):
        check_events(events)
