"""Host threads in the schedule language: a host wait orders only what its
own thread issues later (and what the threads it starts or joins issue).
Each schedule goes through the model and the oracle (they must agree) and,
where it says so, the simulated device."""
import pytest
from hypothesis import find, settings

from npu_lifetime.schedules import (
    Alloc, Free, Join, Op, Read, RecordUse, Schedule, ScheduleError, Spawn, Switch, SyncDevice, SyncStream,
    WaitStream, Write, delay_stream, execute, executor_violation,
)
from npu_lifetime.strategies import schedules

from helpers.schedule_helpers import A, U, W, findings

# the tests that run the model: the C++ one, then model.py's (conftest.py); the others check the
# schedule language or the simulated device alone
BOTH_WAYS = pytest.mark.usefixtures("model_both_ways")

# x made on A, read on U; thread 1 exists before the main thread syncs U
USED = (Alloc(0, A, 0, 16), Write(0, A), WaitStream(U, A), Read(0, U), Spawn(1))
READ = 3


def uncovered(steps):
    return [k for k in findings(*steps) if k[0] == "uncovered_free" and k[1] is not None]


def corrupts(steps) -> bool:
    """Whether running U last lets the freed block's next owner in before the read."""
    return bool(execute(Schedule(3, 2, steps), delay_stream(U), allocator_waits=False).corrupted)


@BOTH_WAYS
def test_a_sync_on_one_thread_does_not_cover_a_free_on_another():
    steps = (*USED, SyncStream(U), Switch(1), Free(0))
    assert uncovered(steps) == [("uncovered_free", 7, 0, U, READ)]
    assert corrupts(steps) and executor_violation(Schedule(3, 2, steps)) is None


@BOTH_WAYS
def test_the_same_sync_on_the_freeing_thread_covers():
    steps = (*USED, Switch(1), SyncStream(U), Free(0))
    assert uncovered(steps) == [] and not corrupts(steps)


@BOTH_WAYS
def test_joining_the_thread_that_synced_covers():
    steps = (*USED, Switch(1), SyncStream(U), Switch(0), Join(1), Free(0))
    assert uncovered(steps) == [] and not corrupts(steps)
    without_join = (*USED, Switch(1), SyncStream(U), Switch(0), Free(0))
    assert uncovered(without_join) == [("uncovered_free", 8, 0, U, READ)] and corrupts(without_join)


@BOTH_WAYS
def test_a_thread_spawned_after_the_sync_starts_ordered_after_it():
    steps = (*USED[:-1], SyncStream(U), Spawn(1), Switch(1), Free(0))
    assert uncovered(steps) == []


@BOTH_WAYS
def test_a_stream_sync_queues_nothing_for_other_threads():
    # thread 0 learns of the read (device sync), then syncs A; thread 1's free
    # of the A block must not be taken as ordered after the read.  The model
    # used to join the syncing thread's clock into A's (found by the fuzzer;
    # so did the simulated device's, which put the sync behind thread 0's gates).
    steps = (Spawn(1), Alloc(0, A, 0, 16), Read(0, U), SyncDevice(), SyncStream(A), Switch(1), Free(0))
    assert uncovered(steps) == [("uncovered_free", 6, 1, U, 2)] and corrupts(steps)


@BOTH_WAYS
def test_wait_stream_records_on_the_waitee_from_the_issuing_thread():
    # the record on U follows thread 0's device sync, so U's later read (issued
    # by thread 1) is ordered after the allocation: no race
    steps = (Spawn(1), Alloc(0, A, 0, 16), SyncDevice(), WaitStream(A, U), Switch(1), Read(0, U))
    assert not any(k[0] == "data_race" for k in findings(*steps))
    assert ("data_race", 4, 1) in findings(Spawn(1), Alloc(0, A, 0, 16), SyncDevice(), Switch(1), Read(0, U))


@BOTH_WAYS
def test_record_use_on_the_allocation_stream_records_nothing():
    # the allocator ignores record_use on the block's own stream, so it does
    # not carry thread 0's sync to thread 1's free; on a third stream it does
    on_a = (*USED, SyncStream(U), RecordUse(0, A), Switch(1), Free(0))
    assert uncovered(on_a) == [("uncovered_free", 8, 0, U, READ)] and corrupts(on_a)
    on_w = (*USED, SyncStream(U), RecordUse(0, W), Switch(1), Free(0))
    assert uncovered(on_w) == [] and not corrupts(on_w)


@pytest.mark.parametrize("steps, message", [
    ((Switch(1),), "thread 1 is not running"),
    ((Join(1),), "thread 1 is not running"),
    ((Spawn(0),), "thread 0 is already running"),
    ((Spawn(1), Spawn(1)), "thread 1 is already running"),
    ((Spawn(1), Switch(1), Join(0)), "cannot be joined"),
    ((Spawn(1), Switch(1), Join(1)), "cannot be joined"),
    ((Spawn(-1),), "a thread is an int >= 0"),
    ((Spawn(True),), "a thread is an int >= 0"),
    ((Alloc(0, 0, 0), Op(0, reads=(0,), after=(Spawn(1),))), "an op issues device events"),
])
def test_invalid_thread_steps_are_rejected(steps, message):
    with pytest.raises(ScheduleError, match=message):
        Schedule(2, 1, steps)


def test_a_joined_thread_can_be_spawned_again_and_the_reproducer_runs(capsys):
    schedule = Schedule(2, 0, (Spawn(1), Switch(1), Alloc(0, 1, 0), Switch(0), Join(1), Spawn(1), Switch(1),
                               Read(0, 0)))
    namespace: dict = {}
    exec(schedule.to_python(), namespace)
    assert namespace["schedule"] == schedule and "agree" in capsys.readouterr().out


def test_generated_thread_steps_shrink_to_the_few_they_need():
    joined = find(schedules(), lambda s: any(isinstance(step, Join) for step in s.steps),
                  settings=settings(database=None, derandomize=True, max_examples=2000))
    assert joined.steps == (Spawn(1), Join(1))
    freed_elsewhere = find(schedules(), _frees_on_another_thread,
                           settings=settings(database=None, derandomize=True, max_examples=2000))
    assert len(freed_elsewhere.steps) <= 4, freed_elsewhere


def _frees_on_another_thread(schedule) -> bool:
    pairs = zip(schedule.steps, schedule.steps[1:], strict=False)
    return any(isinstance(a, Switch) and a.thread and isinstance(b, Free) for a, b in pairs)



@BOTH_WAYS
def test_a_free_on_one_thread_queues_nothing_for_another_threads_free():
    # thread 0 syncs U, then frees another block of A; thread 1 then frees x.
    # A free issues nothing on its stream, so thread 0's free must not order
    # A (and with it thread 1's free) after the sync: thread 1 never learnt of
    # it, and the read can still run after x's reuse.  The simulated device
    # used to queue thread 0's free on A behind its host wait.  Found by
    # `npu-lifetime fuzz --execute` at 200k schedules (seed 1).
    steps = (*USED, Alloc(1, A, 32, 16), SyncStream(U), Free(1), Switch(1), Free(0))
    assert uncovered(steps) == [("uncovered_free", 9, 0, U, READ)]
    assert corrupts(steps) and executor_violation(Schedule(3, 2, steps)) is None


@BOTH_WAYS
def test_work_issued_after_a_sync_does_order_its_stream():
    # unlike a free, a write thread 0 issues on A after its sync runs after
    # the read, and so does whatever A runs later, thread 1's free included
    steps = (*USED, Alloc(1, A, 32, 16), SyncStream(U), Write(1, A), Switch(1), Free(0))
    assert uncovered(steps) == [] and not corrupts(steps)


def test_the_fuzzers_schedule_with_the_sync_inside_the_op():
    schedule = Schedule(streams=2, events=0, steps=(
        Alloc(tensor=0, stream=0, address=0, size=16),
        Spawn(thread=1),
        Alloc(tensor=1, stream=0, address=16, size=16),
        Op(stream=1, reads=(1,), writes=(), before=(), after=(SyncStream(stream=1),)),
        Free(tensor=0),
        Switch(thread=1),
        Free(tensor=1),
    ), devices=1)
    assert executor_violation(schedule, 24819) is None
