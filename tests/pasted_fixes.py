"""Pasting a report's suggested fixes into the program that got it: each
must make ``check`` pass.  ``check(path)`` runs ``npu-lifetime check`` on a
script and returns the finished process."""
from pathlib import Path
from typing import Callable


def suggested_fixes(report: str) -> list:
    """The code of each fix line of a report: ``  fix: where:  code``, or
    under ``  fix (any one):`` the lines ``    where:  code``."""
    return [line.split(":  ", 1)[1] for line in report.splitlines()
            if line.startswith(("    ", "  fix: ")) and ":  " in line]


def assert_each_fix_passes(check: Callable, script: Path, before: str, expected: list, tmp_path: Path) -> None:
    """``script`` fails ``check`` with the fixes ``expected``; each, pasted
    on the line before the line ``before``, makes it pass."""
    done = check(script)
    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    fixes = suggested_fixes(done.stdout)
    assert fixes == expected, done.stdout
    lines = script.read_text().splitlines()
    at = lines.index(before)
    for i, fix in enumerate(fixes):
        fixed = tmp_path / f"fixed{i}.py"
        fixed.write_text("\n".join(["import npu_lifetime", *lines[:at], fix, *lines[at:]]) + "\n")
        done = check(fixed)
        assert done.returncode == 0, (fix, done.stdout, done.stderr[-2000:])
