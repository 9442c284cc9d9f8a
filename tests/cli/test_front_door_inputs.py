"""Bad input at the front door is one message (issue 38, items 7 and 8):
schedules() with a bad argument failed only when drawn, with hypothesis's
InvalidArgument naming no argument; a non-UTF-8 suppressions file was an
18-line traceback and exit 1 from `check`."""
import subprocess
import sys
from pathlib import Path

import pytest

from npu_lifetime.strategies import schedules

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("kwargs, name, error", [
    ({"max_streams": 0}, "max_streams", ValueError), ({"max_steps": -1}, "max_steps", ValueError),
    ({"max_streams": "3"}, "max_streams", TypeError), ({"max_events": 1.5}, "max_events", TypeError),
    ({"blocks": 0}, "blocks", ValueError), ({"max_devices": True}, "max_devices", TypeError),
    ({"misuse": "yes"}, "misuse", TypeError),
])
def test_schedules_refuses_bad_arguments_when_built(kwargs, name, error):
    with pytest.raises(error, match=f"schedules\\(\\): {name} must be"):
        schedules(**kwargs)


def test_good_arguments_still_draw():
    from hypothesis import given, settings

    seen = []

    @settings(max_examples=5, deadline=None)
    @given(schedules(max_streams=2, max_steps=4))
    def draw(schedule):
        seen.append(schedule)

    draw()
    assert seen


def test_a_non_utf8_suppressions_file_is_one_line_and_exit_2(tmp_path):
    rules = tmp_path / "rules.txt"
    rules.write_bytes(b"uncovered_free:fun:\xff\xfe\n")
    script = tmp_path / "ok.py"
    script.write_text("print('ran')\n")
    done = subprocess.run([sys.executable, "-m", "npu_lifetime.cli", "check", "--device", "sim",
                           "--suppressions", str(rules), str(script)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "not UTF-8" in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_a_script_that_raises_after_a_finding_exits_3_with_its_findings_reported(tmp_path):
    """(issue 38, item 7) It exited 1, so a usage error read in a CI log as a lifetime bug."""
    script = tmp_path / "raises.py"
    script.write_text(
        "import gc, torch\nfrom npu_lifetime import simdevice as sd\n"
        "side = sd.Stream()\nx = torch.ones(64)\nside.wait_stream(sd.default_stream())\n"
        "with sd.stream(side):\n    y = x * 2\ndel x\ngc.collect()\n"
        "raise RuntimeError('a usage error after the finding')\n")
    done = subprocess.run([sys.executable, "-m", "npu_lifetime.cli", "check", "--device", "sim", str(script)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 3, done.stdout[-2000:] + done.stderr[-2000:]
    assert "uncovered free" in done.stdout and "1 fail the check" in done.stdout
    assert "a usage error after the finding" in done.stderr
