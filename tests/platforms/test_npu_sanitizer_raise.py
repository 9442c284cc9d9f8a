"""The sanitizer's default raise on npu, under the real torch_npu over the
stand-in CANN runtime (issue 36, item 1): DataRaceError reaches the program,
with the native parts and without, at every task-queue level; never
SystemError, and torch_npu's trace hook never fails."""
import pytest

from helpers.npu_helpers import TASK_QUEUE_LEVELS, program_result, run_npu_program, task_queue_env


@pytest.mark.parametrize("native", ["1", "0"])
@pytest.mark.parametrize("level", TASK_QUEUE_LEVELS)
def test_a_race_raises_data_race_error_on_npu(native, level):
    done = run_npu_program("raise_default.py", env={**task_queue_env(level), "NPU_LIFETIME_NATIVE": native})
    result = program_result(done)
    assert result["raised"] == ["DataRaceError", 1], result
    assert result["in_place"] == "DataRaceError"
    assert "SystemError" not in done.stderr
    assert "trace hook execution failed" not in done.stderr


@pytest.mark.parametrize("native", ["1", "0"])
def test_a_raising_callable_at_the_seam_reaches_the_program_on_npu(native):
    """The fault injection of tests/sanitizer/test_sanitizer_seam_faults.py on npu, where
    torch_npu's trace hook calls into Python at every allocation and free."""
    done = run_npu_program("seam_faults.py", env={"NPU_LIFETIME_NATIVE": native})
    result = program_result(done)
    assert result.pop("none") == ["DataRaceError"], "the unharmed program raises its race"
    output = done.stdout + done.stderr  # torch's trace logs a callback's error on stdout
    assert "SystemError" not in output
    for fault, seen in result.items():
        assert seen != ["(fault not reached)"], fault
        assert "SystemError" not in seen, (fault, seen)
        # the fault reaches the program, or torch's trace caught and logged it (a trace callback's error)
        assert "Boom" in seen or "Exception in callback npu_lifetime_" in output, (fault, seen)
    # the faults outside trace callbacks reach the program itself
    for fault in ("model.access", "sanitizer._stream", "sanitizer._announce_races", "backend.current_stream"):
        assert "Boom" in result[fault], (fault, result[fault])
