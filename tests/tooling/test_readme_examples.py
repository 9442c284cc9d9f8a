"""The README's first example runs as pasted (issue 38, item 4): the
hand-off on the simulated device passes ``npu-lifetime check --device sim``,
and without its ``record_use`` line fails it, naming the fix the README shows."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def _blocks(language: str) -> list:
    """The fenced blocks opened with ```LANGUAGE, in order."""
    blocks, opened, body = [], None, []
    for line in README.splitlines(keepends=True):
        if line.startswith("```") and opened is None:
            opened, body = line[3:].strip(), []
        elif line.startswith("```"):
            if opened == language:
                blocks.append("".join(body))
            opened = None
        elif opened is not None:
            body.append(line)
    return blocks


def _first_example() -> str:
    return _blocks("python")[0]


def _shown_output() -> list:
    """The README's lines of check's output for the buggy form (the block
    after the example's commands), but the elided ones."""
    block = next(b for b in _blocks("") if "[uncovered free" in b)
    return [line for line in block.splitlines() if line.strip() not in ("", "...")]


def _check(tmp_path: Path, source: str) -> subprocess.CompletedProcess:
    (tmp_path / "handoff.py").write_text(source)
    entry = Path(sys.executable).parent / "npu-lifetime"  # the README runs .venv/bin/npu-lifetime
    cli = [str(entry)] if entry.exists() else [sys.executable, "-m", "npu_lifetime.cli"]
    return subprocess.run([*cli, "check", "--device", "sim", "handoff.py"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300)


def test_the_first_example_is_the_simulated_hand_off_with_record_use():
    example = _first_example()
    assert "simdevice" in example and "npu_lifetime.record_use(" in example
    assert len(example.strip().splitlines()) <= 12  # about ten lines
    assert "npu-lifetime check --device sim handoff.py" in README


def test_the_example_as_pasted_passes_check(tmp_path):
    done = _check(tmp_path, _first_example())
    assert done.returncode == 0, done.stdout + done.stderr
    assert "npu_lifetime: no findings" in done.stdout


def test_without_its_record_use_line_check_fails_and_names_the_fix(tmp_path):
    lines = _first_example().splitlines(keepends=True)
    buggy = "".join(line for line in lines if not line.startswith("npu_lifetime.record_use("))
    assert buggy != _first_example()
    done = _check(tmp_path, buggy)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "npu_lifetime.record_use(x, side)" in done.stdout
    out = re.sub(r"0x[0-9a-f]+", "0x...", done.stdout)
    for line in _shown_output():  # what the README shows of the output is what check prints
        assert line in out, (line, out)


@pytest.mark.parametrize("command", [
    "tools/setup_venv.sh && .venv/bin/npu-lifetime fuzz -n 20000 && .venv/bin/npu-lifetime handoff",
    ".venv/bin/python -m pytest -q",
])
def test_the_two_newcomer_commands_are_near_the_top(command):
    assert 0 <= README.index(command) < README.index("## What it does")
