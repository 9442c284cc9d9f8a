"""Deliberately broken C parts, for the tests that show a suite catches one:
an extension built from its source with an ``NPL_MUTANT_...`` macro (the
defect, guarded by ``#ifdef`` there) into a temporary folder, with
setup.py's warning flags, and a suite run in a fresh process with the
mutant loaded in place of the built extension."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# the mutant is found in place of the built extension, whenever the package imports it
LOADER = """
import importlib.util, sys
name, path = sys.argv[1], sys.argv[2]


class Mutant:
    @staticmethod
    def find_spec(fullname, target=None, search=None):
        return importlib.util.spec_from_file_location(name, path) if fullname == name else None


sys.meta_path.insert(0, Mutant)
import pytest
sys.exit(pytest.main(sys.argv[3:]))
"""


def compiler(source: Path):
    """The C or C++ compiler for ``source`` (by its suffix), or None."""
    if source.suffix == ".cpp":
        return shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")
    return shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")


def build_mutant(tmp_path: Path, module: str, source: Path, macro: str) -> Path:
    """``source`` (relative to the checkout) built as the extension
    ``module`` with ``-D<macro>``, warning-free as setup.py builds it."""
    source = ROOT / source
    out = tmp_path / f"{module.rsplit('.', 1)[-1]}{sysconfig.get_config_var('EXT_SUFFIX')}"
    language = ["-std=c++17", "-fvisibility=hidden"] if source.suffix == ".cpp" else ["-std=c11"]
    subprocess.run([compiler(source), "-shared", "-fPIC", *language, "-O2", "-Wall", "-Wextra", "-Werror",
                    f"-D{macro}", f"-I{sysconfig.get_paths()['include']}", str(source), "-o", str(out), "-ldl"],
                   check=True, capture_output=True, text=True)
    return out


def run_with_mutant(module: str, mutant: Path, suite: str, select: str = "native and not python"):
    """``suite``'s tests that ``select`` picks (its native instances), run
    with ``mutant`` loaded as ``module``: the finished process."""
    return subprocess.run([sys.executable, "-c", LOADER, module, str(mutant), "-x", "-q", "-p", "no:cacheprovider",
                           "-k", select, suite], cwd=ROOT, capture_output=True, text=True, timeout=600)


def assert_caught(done) -> None:
    """A native instance failed (pytest's exit status 1: tests failed, not
    an import or collection error)."""
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-2000:]
    assert re.search(r"\[native[]-]", done.stdout), done.stdout[-3000:]  # the failed test's id names it
    assert " failed" in done.stdout.splitlines()[-1], done.stdout[-3000:]
