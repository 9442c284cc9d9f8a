"""record_use's C entry on a real GPU (skipped without one): under the shim
and over the native fallback it is the one taken, and on the same inputs it
does what the Python reference does (test_record_use_entry*.py run the same
comparison on CPU)."""
from pathlib import Path

import pytest
from helpers.gpu_helpers import requires_cuda, run_program

pytestmark = requires_cuda

PROGRAM = Path(__file__).resolve().parents[1] / "platforms" / "record_use_entry_programs.py"  # the NPU test's too


@pytest.mark.parametrize("program, fast", [("shim_entry", "ShimFast"), ("fallback_entry", "FallbackFast")])
def test_the_c_entry_is_taken_and_agrees_with_the_reference(program, fast):
    r = run_program(str(PROGRAM), "cuda", program)
    assert r["entry"] == "builtin_function_or_method" and r["fast"] == fast, r
    disagreements = {case: pair for case, pair in r["outcomes"].items() if pair[0] != pair[1]}
    assert disagreements == {}, disagreements
    assert r["outcomes"]["explicit side stream"][0] == ["done"], r
