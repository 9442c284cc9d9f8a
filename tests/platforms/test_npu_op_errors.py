"""A failing op's own error under the sanitizer on npu (the real torch_npu
over the stand-in CANN runtime).

torch_npu's trace hooks (torch_npu/csrc/sanitizer/PyCallbackTrigger.h,
CONCRETE_TRACE_NPU) import a module and call Python with no save and
restore of the error indicator.  A temporary tensor freed while the op's
error propagates (CPython drops a frame's values with the exception set)
fires the deallocation trace, whose import then fails with "returned a
result with an exception set"; pybind logs that and clears the indicator,
and the program sees "SystemError: error return without exception set"
instead of its RuntimeError.  The hooks' code is inline in torch_npu's own
binary, so no subscriber can stash the error around them (the GPU trace
bridge does it for CUDA by replacing torch's interpreter, which torch_npu's
non-virtual trigger does not allow).  The sanitized case is a strict xfail:
it documents the defect and turns red the day torch_npu fixes it."""
import pytest

from helpers.npu_helpers import program_result, run_npu_program


def test_the_op_error_without_the_sanitizer():
    caught = program_result(run_npu_program("op_error_under_sanitizer.py", "plain"))
    assert caught["type"] == "RuntimeError", caught


@pytest.mark.xfail(strict=True, raises=AssertionError, reason="torch_npu's PyCallbackTrigger calls Python with an error set: "
                                        "the op's RuntimeError becomes a SystemError (docstring)")
def test_the_op_error_survives_the_sanitizer():
    caught = program_result(run_npu_program("op_error_under_sanitizer.py", "sanitized"))
    assert caught["type"] == "RuntimeError", caught
