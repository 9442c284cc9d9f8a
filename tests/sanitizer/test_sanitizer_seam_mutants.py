"""A broken C part is caught by the suites that run both ways (conftest.py's
``both_ways``): each extension is built with its ``NPL_MUTANT_...`` macro
(a deliberate defect, in its source) into a temporary folder, loaded in a
fresh process in place of the built one (helpers/mutants.py), and a
representative suite's native instance must fail there (pytest's exit
status 1: tests failed, not an import or collection error).  The package's
other C parts: tests/test_seam_mutants.py."""
from pathlib import Path

import pytest

from helpers.mutants import assert_caught, build_mutant, compiler, run_with_mutant
from npu_lifetime.sanitizer import native

SOURCES = "npu_lifetime/sanitizer/_c"

# extension, its mutant macro, the suite (and -k) that must catch it
MUTANTS = [
    ("_op_feed", "NPL_MUTANT_OP_FEED", "tests/sanitizer/test_sanitizer_verdicts.py"),
    ("_dispatch", "NPL_MUTANT_DISPATCH", "tests/sanitizer/test_sanitizer_verdicts.py"),
    ("_storage_feed", "NPL_MUTANT_STORAGE_FEED", "tests/sanitizer/test_sanitizer_verdicts.py"),
    ("_event_feed", "NPL_MUTANT_EVENT_FEED", "tests/sanitizer/test_sanitizer_verdicts.py"),
    ("_scan", "NPL_MUTANT_SCAN", "tests/sanitizer/test_sanitizer_verdicts.py"),
    ("_frames", "NPL_MUTANT_FRAMES", "tests/sanitizer/test_sanitizer_reports.py"),
    # the threads suite does not catch this one (the feeds take the host themselves): the lock's own both-ways test
    ("_host_lock", "NPL_MUTANT_HOST_LOCK", "tests/sanitizer/test_host_lock.py"),
    # the simulated device's frees do not go through the trace hook: the trace's own both-ways test
    ("_trace_hook", "NPL_MUTANT_TRACE_HOOK", "tests/sanitizer/test_trace_feed.py"),
    # the verdicts suite issues no event inside an op: the devices suite's host read-backs inside one do
    ("_event_hook", "NPL_MUTANT_EVENT_HOOK", "tests/sanitizer/test_sanitizer_devices.py"),
    ("_threads", "NPL_MUTANT_THREADS", "tests/sanitizer/test_sanitizer_threads.py"),
]

if compiler(Path(f"{SOURCES}/_op_feed.c")) is None or native.default().name != "native" or native.dispatch is None:
    pytest.skip("needs a C compiler and the sanitizer's native parts", allow_module_level=True)


@pytest.mark.parametrize("extension, macro, suite", MUTANTS, ids=[m[1] for m in MUTANTS])
def test_a_broken_c_part_fails_its_suite(tmp_path, extension, macro, suite):
    module = f"npu_lifetime.sanitizer.{extension}"
    mutant = build_mutant(tmp_path, module, Path(f"{SOURCES}/{extension}.c"), macro)
    assert_caught(run_with_mutant(module, mutant, suite))
