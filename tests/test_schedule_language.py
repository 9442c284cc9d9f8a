import pytest

from npu_lifetime.schedules import Alloc, Read, Schedule, ScheduleError, View, WaitStream


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
