"""The coverage and race rules behind the table: transitivity, host waits,
erase_stream, views, address reuse, and what each finding carries."""
from npu_lifetime.schedules import (
    Alloc, EraseStream, Free, QueryEvent, Read, RecordEvent, RecordStream, RecordUse,
    SyncEvent, SyncStream, View, WaitEvent, WaitStream, Write,
)

from schedule_helpers import A, U, W, findings, verdict

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


def test_uncovered_free_names_the_last_uncovered_use():
    steps = (*CREATE, Read(0, U), RecordUse(0, U), Read(0, U), Write(0, U), Free(0))
    assert [k for k in findings(*steps) if k[0] == "uncovered_free"] == [
        ("uncovered_free", 7, 0, U, 6)
    ]


def test_flush_reports_live_storages_without_a_free():
    steps = (*CREATE, Read(0, U))
    assert findings(*steps) == [("uncovered_free", None, 0, U, 3)]
