"""Fix lines use only names in scope where they are to be pasted (issue 36,
item 7): a tensor and a stream made in a helper function and used in
another were named by the helper's variables (``record_use(buf, s)`` in a
function that calls them ``x`` and ``side``): pasted there, a NameError.
Out of scope, a fix says ``<buf>`` / ``<s>`` and a note defines each."""
import gc
import re

import pytest
import torch

from npu_lifetime import simdevice as sd
from npu_lifetime.sanitizer import LifetimeSanitizer, user_names

pytestmark = pytest.mark.usefixtures("both_ways")  # conftest.py: C parts, then Python's


def make():
    buf = torch.ones(64)
    s = sd.Stream()
    return buf, s


def step(x, side):
    side.wait_stream(sd.default_stream())
    with sd.stream(side):
        y = x * 2
    return y


def fix_lines(report: str) -> list:
    return [line.strip() for line in report.splitlines() if line.startswith("    ") and ":  " in line]


def test_names_from_another_function_become_defined_placeholders():
    with LifetimeSanitizer("sim", on_race="collect", warn_on_free=False) as san:
        x, side = make()
        y = step(x, side)
        del x
        gc.collect()
    report = san.report(san.flush())
    lines = fix_lines(report)
    assert lines, report
    for line in lines:
        pasted = line.split(":  ", 1)[1]
        assert not re.search(r"(?<![<\w])(buf|s)(?![>\w])", pasted), line  # no bare helper-only name
    assert "npu_lifetime.record_use(<buf>, <s>)" in report
    first = make.__code__.co_firstlineno
    assert f"(<buf>: the tensor allocated as `buf` at test_sanitizer_fix_scope.py:{first + 1} in make)" in report
    assert f"(<s>: the stream made as `s` at test_sanitizer_fix_scope.py:{first + 2} in make;" in report
    del y


def test_names_in_scope_stay_the_programs_own():
    with LifetimeSanitizer("sim", on_race="collect", warn_on_free=False) as san:
        buf = torch.ones(64)
        s = sd.Stream()
        s.wait_stream(sd.default_stream())
        with sd.stream(s):
            y = buf * 2
        del buf
        gc.collect()
    report = san.report(san.flush())
    assert "npu_lifetime.record_use(buf, s)" in report
    assert "npu_lifetime.record_stream(buf, s)" in report
    assert "<buf>" not in report and "<s>" not in report
    del y


class _Site:
    def __init__(self, code):
        self.frames = [(code, 1)]


def test_a_module_level_name_is_in_scope_in_the_modules_functions():
    """A name bound at module level is a global in every function of the file;
    a function's local is in scope in that function only."""
    module = compile("x = 1\n", "prog.py", "exec")
    other_file = compile("x = 1\n", "other.py", "exec")
    assert user_names.in_scope(_Site(module), _Site(step.__code__)) is False  # another file
    here = compile("x = 1\n", step.__code__.co_filename, "exec")
    assert user_names.in_scope(_Site(here), _Site(step.__code__))
    assert not user_names.in_scope(_Site(make.__code__), _Site(step.__code__))
    assert user_names.in_scope(_Site(step.__code__), _Site(step.__code__))
    assert user_names.in_scope(_Site(other_file), None)  # no paste site known: the name stays


def test_a_fix_that_calls_npu_lifetime_says_to_import_it_where_the_script_does_not(tmp_path):
    """(issue 38, item 6) npu_lifetime.record_use(x, side) was suggested to a
    script that never imported npu_lifetime: a NameError when pasted."""
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "no_import.py"
    script.write_text("import gc, torch\nfrom npu_lifetime import simdevice as sd\nside = sd.Stream()\n"
                      "x = torch.ones(64)\nside.wait_stream(sd.default_stream())\nwith sd.stream(side):\n"
                      "    y = x * 2\ndel x\ngc.collect()\n")
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-m", "npu_lifetime.cli", "check", "--device", "sim", str(script)],
                          capture_output=True, text=True, cwd=root, timeout=300)
    assert "npu_lifetime.record_use(x, side)" in done.stdout
    assert "(add `import npu_lifetime` at the top of no_import.py: the fix calls it)" in done.stdout
    script.write_text("import npu_lifetime\n" + script.read_text())
    done = subprocess.run([sys.executable, "-m", "npu_lifetime.cli", "check", "--device", "sim", str(script)],
                          capture_output=True, text=True, cwd=root, timeout=300)
    assert "npu_lifetime.record_use(x, side)" in done.stdout and "add `import npu_lifetime`" not in done.stdout


def test_a_free_no_user_frame_made_says_where_to_put_the_fix():
    from npu_lifetime.sanitizer import report

    class NoFrames:
        def user_frames(self):
            return []

    assert "before the end of the script" in report._free_place(NoFrames())
