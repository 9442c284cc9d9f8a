"""A broken C part is caught by the suites that run both ways (conftest.py's
``both_ways``): each extension is built with its ``NPL_MUTANT_...`` macro
(a deliberate defect, in its source) into a temporary folder, loaded in a
fresh process in place of the built one, and a representative suite's
native instance must fail there (pytest's exit status 1: tests failed, not
an import or collection error)."""
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from npu_lifetime.sanitizer import native

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ROOT / "npu_lifetime" / "sanitizer" / "_c"

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
]

# loads the mutant under the built extension's name before the package imports it
LOADER = """
import importlib.util, sys
name, path = sys.argv[1], sys.argv[2]
spec = importlib.util.spec_from_file_location(name, path)
module = importlib.util.module_from_spec(spec)
sys.modules[name] = module
spec.loader.exec_module(module)
import pytest
sys.exit(pytest.main(sys.argv[3:]))
"""

CC = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
if CC is None or native.default().name != "native" or native.dispatch is None:
    pytest.skip("needs a C compiler and the sanitizer's native parts", allow_module_level=True)


def build_mutant(tmp_path: Path, extension: str, macro: str) -> Path:
    out = tmp_path / f"{extension}{sysconfig.get_config_var('EXT_SUFFIX')}"
    subprocess.run([CC, "-shared", "-fPIC", "-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", f"-D{macro}",
                    f"-I{sysconfig.get_paths()['include']}", str(SOURCES / f"{extension}.c"), "-o", str(out)],
                   check=True, capture_output=True, text=True)
    return out


@pytest.mark.parametrize("extension, macro, suite", MUTANTS, ids=[m[1] for m in MUTANTS])
def test_a_broken_c_part_fails_its_suite(tmp_path, extension, macro, suite):
    mutant = build_mutant(tmp_path, extension, macro)
    done = subprocess.run([sys.executable, "-c", LOADER, f"npu_lifetime.sanitizer.{extension}", str(mutant),
                           "-x", "-q", "-p", "no:cacheprovider", "-k", "native and not python", suite],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-2000:]  # 1: a test failed
    assert "[native]" in done.stdout and " failed" in done.stdout.splitlines()[-1]
