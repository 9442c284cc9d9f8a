"""Every row of the brief's lifetime table, both columns, on the model and the
oracle.  x is created (allocated and written) on A and used (read) on U.
Where the table says "possible" or "unresolved", both outcomes are tested:
the row's own synchronisation does not decide the race, the rest does."""
import pytest

from npu_lifetime.schedules import (
    Alloc, Free, Read, RecordStream, RecordUse, SyncDevice, WaitStream, Write,
)

from helpers.schedule_helpers import A, U, verdict

pytestmark = pytest.mark.usefixtures("model_both_ways")  # conftest.py: the C++ model, then model.py's

CREATE = (Alloc(0, A, 0x1000), Write(0, A))


def test_no_sync_at_all():
    assert verdict(*CREATE, Read(0, U), Free(0)) == (True, False)


def test_u_waits_for_a_only():
    assert verdict(*CREATE, WaitStream(U, A), Read(0, U), Free(0)) == (False, False)


def test_a_waits_for_u_after_the_use_race_possible():
    # covers the free; the read itself was never ordered after the creating write
    assert verdict(*CREATE, Read(0, U), WaitStream(A, U), Free(0)) == (True, True)


def test_both_directions():
    steps = (*CREATE, WaitStream(U, A), Read(0, U), WaitStream(A, U), Free(0))
    assert verdict(*steps) == (False, True)


def test_device_synchronize_after_the_use():
    # synchronised after the creation too, as the row intends: no race
    steps = (*CREATE, SyncDevice(), Read(0, U), SyncDevice(), Free(0))
    assert verdict(*steps) == (False, True)


def test_device_synchronize_only_after_the_use_still_covers():
    # the same rules: the sync covers the free but cannot order the read
    # after the write that created x
    assert verdict(*CREATE, Read(0, U), SyncDevice(), Free(0)) == (True, True)


def test_record_stream_unresolved_race_covered_free():
    assert verdict(*CREATE, Read(0, U), RecordStream(0, U), Free(0)) == (True, True)
    steps = (*CREATE, WaitStream(U, A), Read(0, U), RecordStream(0, U), Free(0))
    assert verdict(*steps) == (False, True)


def test_record_stream_before_the_use_covers_it():
    steps = (*CREATE, RecordStream(0, U), WaitStream(U, A), Read(0, U), Free(0))
    assert verdict(*steps) == (False, True)


def test_record_use_after_the_last_use():
    assert verdict(*CREATE, Read(0, U), RecordUse(0, U), Free(0)) == (True, True)
    steps = (*CREATE, WaitStream(U, A), Read(0, U), RecordUse(0, U), Free(0))
    assert verdict(*steps) == (False, True)


def test_record_use_before_a_later_use():
    steps = (*CREATE, WaitStream(U, A), Read(0, U), RecordUse(0, U), Read(0, U), Free(0))
    assert verdict(*steps) == (False, False)


def test_same_stream():
    assert verdict(*CREATE, Read(0, A), Write(0, A), Free(0)) == (False, True)
