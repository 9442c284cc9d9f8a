"""The sanitizer's default raise on npu, under the real torch_npu over the
stand-in CANN runtime (issue 36, item 1): DataRaceError reaches the program,
with the native parts and without, at every task-queue level; never
SystemError, and torch_npu's trace hook never fails."""
import pytest

from npu_helpers import TASK_QUEUE_LEVELS, program_result, run_npu_program, task_queue_env


@pytest.mark.parametrize("native", ["1", "0"])
@pytest.mark.parametrize("level", TASK_QUEUE_LEVELS)
def test_a_race_raises_data_race_error_on_npu(native, level):
    done = run_npu_program("raise_default.py", env={**task_queue_env(level), "NPU_LIFETIME_NATIVE": native})
    result = program_result(done)
    assert result["raised"] == ["DataRaceError", 1], result
    assert result["in_place"] == "DataRaceError"
    assert "SystemError" not in done.stderr
    assert "trace hook execution failed" not in done.stderr
