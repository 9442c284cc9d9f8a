"""record_use's C entry on the real torch_npu over the stand-in CANN runtime
(skipped without the torch_npu interpreter): under the shim through the NPU
bridge and over torch_npu's allocator it is the one taken, and it does what
the Python reference does on the same inputs.  Nothing here runs on NPU
hardware: the stand-in tells whether the entry is right there, not what a
call costs on an NPU (bench_record_use.py --device npu times its host side)."""
from pathlib import Path

import pytest
from helpers.npu_helpers import program_result, run_npu_program

PROGRAM = Path(__file__).resolve().parents[1] / "platforms" / "record_use_entry_programs.py"  # the GPU test's too


@pytest.mark.parametrize("program, fast", [("shim_entry", "ShimFast"), ("fallback_entry", "FallbackFast")])
def test_the_c_entry_is_taken_and_agrees_with_the_reference(program, fast):
    r = program_result(run_npu_program(str(PROGRAM), "npu", program))
    assert r["entry"] == "builtin_function_or_method" and r["fast"] == fast, r
    disagreements = {case: pair for case, pair in r["outcomes"].items() if pair[0] != pair[1]}
    assert disagreements == {}, disagreements
    assert r["outcomes"]["explicit side stream"][0] == ["done"], r
