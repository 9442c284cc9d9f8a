import pytest

from npu_lifetime.schedules import (
    Adopt, Alloc, DeleteEvent, Op, Read, RecordEvent, Schedule, ScheduleError, SyncDevice, SyncStream, View,
    WaitEvent, WaitStream,
)


@pytest.mark.parametrize("steps, message", [
    ((Read(0, 0),), "unknown tensor 0"),
    ((Alloc(0, 5, 0),), "stream 5 out of range"),
    ((Alloc(0, 0, 0), Alloc(0, 0, 8)), "already named"),
    ((View(1, 0),), "view of unknown tensor"),
    ((WaitStream(0, 2),), "stream 2 out of range"),
])
def test_invalid_schedules_are_rejected(steps, message):
    with pytest.raises(ScheduleError, match=message):
        Schedule(2, 0, steps)


def test_to_python_is_a_runnable_reproducer(capsys):
    schedule = Schedule(2, 1, (Alloc(0, 0, 4096), Read(0, 1)))
    namespace: dict = {}
    exec(schedule.to_python(), namespace)
    assert namespace["schedule"] == schedule
    assert "agree" in capsys.readouterr().out


@pytest.mark.parametrize("steps, message", [
    ((Alloc(0, 0, 0), Op(1, reads=(0,), before=(SyncStream(1),))), "before its kernels"),
    ((Alloc(0, 0, 0), Op(1, reads=(0,), before=(RecordEvent(0, 1),))), "before its kernels"),
    ((Alloc(0, 0, 0), Op(1, reads=(0,), after=(WaitEvent(1, 0),))), "after its kernels"),
    ((Op(0, reads=(3,)),), "unknown tensor 3"),
    ((SyncDevice(2),), "device 2 out of range"),
    ((Adopt(0, 0, 0), Adopt(0, 1, 16)), "already named"),
])
def test_invalid_new_steps_are_rejected(steps, message):
    with pytest.raises(ScheduleError, match=message):
        Schedule(2, 1, steps, devices=2)


def test_streams_are_spread_over_devices():
    schedule = Schedule(4, 0, (), devices=2)
    assert [schedule.device_of(s) for s in range(4)] == [0, 1, 0, 1]


def test_a_reproducer_with_every_new_step_runs(capsys):
    schedule = Schedule(3, 2, (
        Adopt(0, 1, 0, 16), Alloc(1, 0, 16, 8), DeleteEvent(1), SyncDevice(1),
        Op(2, reads=(0,), writes=(1,), before=(RecordEvent(0, 0), WaitEvent(2, 0)), after=(SyncStream(2),)),
    ), devices=2)
    namespace: dict = {}
    exec(schedule.to_python(), namespace)
    assert namespace["schedule"] == schedule and "agree" in capsys.readouterr().out


def test_generated_schedules_contain_every_kind_and_are_long():
    import random
    from collections import Counter

    from npu_lifetime.schedules.strategies import random_schedule

    rng = random.Random(0)
    kinds, lengths = Counter(), []
    for _ in range(400):
        schedule, _, _ = random_schedule(rng, 4, 3, 40, misuse=False)
        lengths.append(len(schedule.steps))
        for step in schedule.steps:
            kinds[type(step).__name__] += 1
            for inner in getattr(step, "before", ()) + getattr(step, "after", ()):
                kinds["in-op " + type(inner).__name__] += 1
    expected = {"Alloc", "Adopt", "View", "Read", "Write", "Free", "RecordStream", "EraseStream", "RecordUse",
                "RecordEvent", "WaitEvent", "SyncEvent", "QueryEvent", "WaitStream", "SyncStream", "SyncDevice",
                "DeleteEvent", "Op", "in-op WaitEvent", "in-op RecordEvent", "in-op SyncStream", "in-op SyncDevice",
                "Spawn", "Switch", "Join"}
    assert expected <= set(kinds), expected - set(kinds)
    assert sum(lengths) / len(lengths) > 15 and max(lengths) >= 35
