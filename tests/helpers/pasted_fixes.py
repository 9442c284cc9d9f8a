"""Pasting a report's suggested fixes into the program that got it, each
where the report says (``after the last use (op at prog.py:8)``, ``before
the free (prog.py:9)``): each must make ``check`` pass.  ``check(path)`` runs
``npu-lifetime check`` on a script and returns the finished process."""
import re
from pathlib import Path
from typing import Callable

_WHERE = re.compile(r"\b(after|before) .*?([\w.-]+\.py):(\d+)\)\s*$")


def suggested_fixes(report: str) -> list:
    """The code of each fix line of a report: ``  fix: where:  code``, or
    under ``  fix (any one):`` the lines ``    where:  code``."""
    return [line.split(":  ", 1)[1] for line in _fix_lines(report)]


def _fix_lines(report: str) -> list:
    return [line for line in report.splitlines() if line.startswith(("    ", "  fix: ")) and ":  " in line]


def pasted(lines: list, fix_line: str) -> list:
    """``lines`` with the fix of ``fix_line`` on its own line where the fix
    says, indented as the line it refers to."""
    where, code = fix_line.split(":  ", 1)
    found = _WHERE.search(where)
    assert found, f"the fix does not say where it goes: {fix_line!r}"
    side, line = found.group(1), int(found.group(3))
    target = lines[line - 1]
    indent = target[:len(target) - len(target.lstrip())]
    at = line if side == "after" else line - 1
    return [*lines[:at], indent + code, *lines[at:]]


def assert_each_fix_passes(check: Callable, script: Path, expected: list, tmp_path: Path) -> None:
    """``script`` fails ``check`` with the fixes ``expected``; each, pasted
    where its line says, makes it pass."""
    done = check(script)
    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    assert suggested_fixes(done.stdout) == expected, done.stdout
    lines = script.read_text().splitlines()
    for i, fix_line in enumerate(_fix_lines(done.stdout)):
        fixed = tmp_path / f"fixed{i}.py"
        fixed.write_text("\n".join(["import npu_lifetime", *pasted(lines, fix_line)]) + "\n")
        done = check(fixed)
        assert done.returncode == 0, (fix_line, done.stdout, done.stderr[-2000:])
