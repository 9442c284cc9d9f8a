"""Issue 36 on CUDA: the default raise gives DataRaceError (it gave
SystemError with the native parts on: the race's fresh output was released
with the error pending and torch's trace hook cleared it), under torch's
allocator and under the shim, with the native parts on and off; and a race
made in a worker thread is caught."""
import os

import pytest

from helpers.gpu_helpers import requires_cuda, run_program

pytestmark = requires_cuda


@pytest.mark.parametrize("native", ["1", "0"])
@pytest.mark.parametrize("allocator", ["torch", "shim"])
def test_the_default_raise_reaches_the_program_on_cuda(native, allocator, monkeypatch):
    monkeypatch.setenv("NPU_LIFETIME_NATIVE", native)
    args = ("raise", "shim") if allocator == "shim" else ("raise",)
    result = run_program("default_raise_programs.py", *args)
    assert result == {"fresh_output": ["DataRaceError", 1], "in_place": ["DataRaceError", 1]}, result


def test_a_race_in_a_worker_thread_is_caught_on_cuda():
    assert run_program("default_raise_programs.py", "thread")["kinds"] == ["data_race", "uncovered_free"]
