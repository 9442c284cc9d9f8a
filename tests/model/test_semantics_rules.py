"""The coverage and race rules behind the table: transitivity, host waits,
erase_stream, views, address reuse, and what each finding carries."""
import pytest

from npu_lifetime.schedules import (
    Alloc, EraseStream, Free, Op, QueryEvent, Read, RecordEvent, RecordStream, RecordUse,
    SyncEvent, SyncStream, View, WaitEvent, WaitStream, Write,
)

from helpers.schedule_helpers import A, U, W, findings, verdict

pytestmark = pytest.mark.usefixtures("model_both_ways")  # conftest.py: the C++ model, then model.py's

CREATE = (Alloc(0, A, 0x1000), Write(0, A), WaitStream(U, A))


def test_wait_event_recorded_after_the_use_covers():
    steps = (*CREATE, Read(0, U), RecordEvent(0, U), WaitEvent(A, 0), Free(0))
    assert verdict(*steps) == (False, True)


def test_wait_event_recorded_before_the_use_does_not_cover():
    steps = (*CREATE, RecordEvent(0, U), Read(0, U), WaitEvent(A, 0), Free(0))
    assert verdict(*steps) == (False, False)


def test_a_waits_for_u_transitively_through_another_stream():
    steps = (*CREATE, Read(0, U), WaitStream(W, U), WaitStream(A, W), Free(0))
    assert verdict(*steps) == (False, True)


def test_host_waits_cover():
    for host_wait in (SyncStream(U),):
        assert verdict(*CREATE, Read(0, U), host_wait, Free(0)) == (False, True)
    for host_wait in (SyncEvent(0), QueryEvent(0)):
        steps = (*CREATE, Read(0, U), RecordEvent(0, U), host_wait, Free(0))
        assert verdict(*steps) == (False, True)


def test_synchronizing_another_stream_does_not_cover():
    assert verdict(*CREATE, Read(0, U), SyncStream(W), Free(0)) == (False, False)


def test_u_waiting_for_a_does_not_cover():
    assert verdict(*CREATE, Read(0, U), WaitStream(U, A), Free(0)) == (False, False)


def test_record_use_on_another_stream_covers_what_it_waited_for():
    steps = (*CREATE, Read(0, U), WaitStream(W, U), RecordUse(0, W), Free(0))
    assert verdict(*steps) == (False, True)


def test_erase_stream_withdraws_record_stream():
    steps = (*CREATE, Read(0, U), RecordStream(0, U), EraseStream(0, U), Free(0))
    assert verdict(*steps) == (False, False)
    steps = (*CREATE, Read(0, U), RecordStream(0, U), EraseStream(0, U), RecordStream(0, U), Free(0))
    assert verdict(*steps) == (False, True)


def test_views_share_the_storage_state():
    steps = (*CREATE, View(1, 0), Read(1, U), RecordStream(1, U), Free(0))
    assert verdict(*steps) == (False, True)
    steps = (*CREATE, View(1, 0), Read(1, U), Free(0))
    assert verdict(*steps) == (False, False)


def test_reused_address_starts_clean():
    first = (*CREATE, Read(0, U), RecordStream(0, U), Free(0))
    second = (Alloc(1, A, 0x1000), Write(1, A), WaitStream(U, A), Read(1, U), Free(1))
    found = findings(*first, *second)
    assert found == [("uncovered_free", 10, 6, U, 9)]


def test_record_stream_and_record_use_never_hide_a_race():
    steps = (Alloc(0, A, 0x1000), Write(0, A), RecordStream(0, U), RecordUse(0, U), Read(0, U))
    # the read races with the creating write; the live free is covered
    assert findings(*steps) == [("data_race", 4, 1)]


def test_write_after_read_race_names_the_latest_racing_read_per_stream():
    steps = (*CREATE, Read(0, U), Read(0, U), Write(0, A))
    assert ("data_race", 5, 4) in findings(*steps)


def test_a_read_races_with_an_earlier_write_the_last_write_raced_with():
    # W1 on U and W2 on W race; the read on W follows W2 but not W1.  The
    # model checked the last write only and missed it.
    steps = (*CREATE, WaitStream(W, A), Write(0, U), Write(0, W), Read(0, W))
    found = findings(*steps)
    assert ("data_race", 6, 4) in found and ("data_race", 6, 5) not in found


def test_the_minimal_missed_race_the_fuzzer_found():
    # the read on U follows U's write, not the allocation on A that write raced with
    steps = (Alloc(0, A, 0), Write(0, U), Read(0, U))
    assert [k for k in findings(*steps) if k[0] == "data_race"] == [("data_race", 1, 0), ("data_race", 2, 0)]


def test_a_write_races_with_a_read_an_earlier_write_raced_with():
    # the write on W raced with U's read; the next write on W is still not
    # ordered after that read
    steps = (*CREATE, Read(0, U), WaitStream(W, A), Write(0, W), Write(0, W))
    assert ("data_race", 6, 3) in findings(*steps)


def test_an_unrecorded_wait_is_no_finding_and_orders_nothing():
    # the contract: a wait on an event never recorded is a no-op, as on the device
    steps = (Alloc(0, A, 0), WaitEvent(U, 0), Read(0, U))
    assert [k[0] for k in findings(*steps)] == ["data_race", "uncovered_free"]


def test_uncovered_free_names_the_last_uncovered_use():
    steps = (*CREATE, Read(0, U), RecordUse(0, U), Read(0, U), Write(0, U), Free(0))
    assert [k for k in findings(*steps) if k[0] == "uncovered_free"] == [
        ("uncovered_free", 7, 0, U, 6)
    ]


def test_flush_reports_live_storages_without_a_free():
    steps = (*CREATE, Read(0, U))
    assert findings(*steps) == [("uncovered_free", None, 0, U, 3)]


# -- reuse races: a new owner of freed memory against the uses its free left ----

def uncovered_then_reused(*between, new=(Alloc(1, A, 0x1000, 16),), access=Write(1, A)):
    """x (16 cells) read on U and freed uncovered; ``between``; then a new
    owner of (part of) its memory, allocated and accessed on A."""
    return (Alloc(0, A, 0x1000, 16), Write(0, A), WaitStream(U, A), Read(0, U), Free(0), *between, *new, access)


def test_a_new_owners_write_not_ordered_after_the_use_is_a_reuse_race():
    found = findings(*uncovered_then_reused())
    assert ("reuse_race", 6, 5, 0, U, 3) in found and ("uncovered_free", 4, 0, U, 3) in found


def test_a_split_block_overlapping_the_freed_range_races_too():
    found = findings(*uncovered_then_reused(new=(Alloc(1, A, 0x1008, 4),)))
    assert ("reuse_race", 6, 5, 0, U, 3) in found


def test_memory_outside_the_freed_range_does_not():
    found = findings(*uncovered_then_reused(new=(Alloc(1, A, 0x1010, 4),)))
    assert not any(k[0] == "reuse_race" for k in found)


def test_a_new_owner_ordered_after_the_use_is_safe():
    assert not any(k[0] == "reuse_race" for k in findings(*uncovered_then_reused(WaitStream(A, U))))
    assert not any(k[0] == "reuse_race" for k in findings(*uncovered_then_reused(SyncStream(U))))


def test_a_read_after_a_read_is_no_reuse_race():
    found = findings(*uncovered_then_reused(access=Read(1, A)))
    assert not any(k[0] == "reuse_race" for k in found)


def test_a_reuse_race_is_reported_once_per_owner_and_use():
    steps = uncovered_then_reused()
    found = findings(*steps, Write(1, A), Read(1, W))
    assert len([k for k in found if k[0] == "reuse_race"]) == 1


def _model_outcomes(model_class, steps):
    from npu_lifetime.schedules import Schedule, feed

    model = model_class()
    feed(Schedule(3, 2, steps), model)
    return [f for f in model.findings if f.kind == "uncovered_free"]


def test_the_outcome_says_why_a_free_is_latent_or_that_it_is_actual(model_both_ways):
    [free] = _model_outcomes(model_both_ways, uncovered_then_reused())
    assert free.actual and free.outcome.race is not None
    [free] = _model_outcomes(model_both_ways, uncovered_then_reused(WaitStream(A, U)))
    assert not free.actual and "ordered after the use" in free.outcome.reason()
    [free] = _model_outcomes(model_both_ways, uncovered_then_reused(SyncStream(U)))
    assert "not reused before the host waited past the use" in free.outcome.reason()
    freed = (Alloc(0, A, 0x1000, 16), WaitStream(U, A), Read(0, U), Free(0))
    [free] = _model_outcomes(model_both_ways, freed)
    assert free.outcome.reason() == "the memory was not reused while the sanitizer watched"
    [free] = _model_outcomes(model_both_ways, (*freed, SyncStream(U)))
    assert "not reused before the host waited past the use" in free.outcome.reason()


# -- ops that issue events of their own ------------------------------------------

def test_an_ops_host_sync_comes_after_its_read():
    # read on U, then the op syncs U: the later write on A is ordered after the read
    steps = (Alloc(0, A, 0x1000), Write(0, A), WaitStream(U, A),
             Op(U, reads=(0,), after=(SyncStream(U),)), Write(0, A))
    assert not any(k[0] == "data_race" for k in findings(*steps))


def test_an_ops_barrier_comes_before_its_accesses_and_its_record_after():
    # a cross-device-copy-like op on U: U waits for A's write first; its
    # completion event, waited on by A, orders A's later read after the copy
    steps = (Alloc(0, A, 0x1000), Write(0, A),
             Op(U, writes=(0,), before=(RecordEvent(0, A), WaitEvent(U, 0)),
                after=(RecordEvent(1, U), WaitEvent(A, 1))),
             Read(0, A))
    assert not any(k[0] == "data_race" for k in findings(*steps))


def test_memory_the_allocator_holds_until_the_use_is_done_cannot_race(model_both_ways):
    m = model_both_ways()
    for s in (A, U):
        m.create_stream(s)
    m.allocate("x", A, address=0x1000, size=16)
    m.wait_stream(U, A)
    m.read("x", U)
    [free] = m.free("x")
    m.allocator_holds(free)  # the shim was told (note_use) and defers the reuse
    m.allocate("z", A, address=0x1000, size=16)
    assert m.write("z", A) == []
    assert "held the block" in free.outcome.reason()
