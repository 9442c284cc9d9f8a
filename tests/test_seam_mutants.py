"""A broken C part outside the sanitizer is caught by the suite that runs
it both ways (conftest.py's record_both_ways, hooks_both_ways,
model_both_ways): each extension is built with its ``NPL_MUTANT_...``
macro (a deliberate defect, in its source) into a temporary folder, found
in a fresh process in place of the built one (helpers/mutants.py), and the
suite's native instance must fail there.  The sanitizer's C parts:
tests/sanitizer/test_sanitizer_seam_mutants.py."""
from pathlib import Path

import pytest

from helpers.mutants import assert_caught, build_mutant, compiler, run_with_mutant
from npu_lifetime import native_parts

# extension, its source, its mutant macro (the defect: a comment at the macro), the suite that must catch it
MUTANTS = [
    ("npu_lifetime.recording._entry", "npu_lifetime/recording/_entry.c", "NPL_MUTANT_ENTRY",
     "tests/recording/test_record_use.py"),
    ("npu_lifetime.recording._holds", "npu_lifetime/recording/_holds.cpp", "NPL_MUTANT_HOLDS",
     "tests/recording/test_torch_allocator_fallback.py"),
    ("npu_lifetime.lifetime._native_model", "npu_lifetime/lifetime/native_model.cpp", "NPL_MUTANT_NATIVE_MODEL",
     "tests/model/test_semantics_table.py"),
    ("npu_lifetime.shim._hook_relay", "npu_lifetime/shim/_hook_relay.c", "NPL_MUTANT_HOOK_RELAY",
     "tests/shim/test_hook_relay.py"),
]


@pytest.mark.parametrize("module, source, macro, suite", MUTANTS, ids=[m[2] for m in MUTANTS])
def test_a_broken_c_part_fails_its_suite(tmp_path, module, source, macro, suite):
    if compiler(Path(source)) is None:
        pytest.skip(f"no compiler for {source}")
    if native_parts.load(module) is None:
        pytest.skip(f"{module} is off or not built: its suite has no native instance")
    assert_caught(run_with_mutant(module, build_mutant(tmp_path, module, Path(source), macro), suite))
