"""tools/diag_chain_parts.py switches parts of the sanitizer off by
rewriting the native dispatch path's state by index: each part must switch
off what it says, and only that (the indices follow _dispatch.c's layout)."""
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PROGRAM = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[2])
    import torch
    import diag_chain_parts as diag
    from npu_lifetime import simdevice as sd
    from npu_lifetime.sanitizer import dispatch, native

    diag._setup(sys.argv[1], "sim")
    side = sd.Stream()
    a = torch.ones(4)
    with sd.stream(side):
        a.add_(1)
    b = a * 2  # the default stream reads a without waiting for side's write
    findings = dispatch._active[0].flush()
    races = [f for f in findings if f.kind == "data_race"]
    where = sorted({f.access.site.frames[0][0].co_filename.rsplit("/", 1)[-1] for f in races})
    print(native.in_use()["dispatch"], sorted({f.kind for f in findings}), where)
""")


def _kinds(part: str, tmp_path: Path) -> str:
    program = tmp_path / "racy.py"
    program.write_text(PROGRAM)
    done = subprocess.run([sys.executable, str(program), part, str(ROOT / "tools")], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("part, site", [("lifetime", "racy.py"), ("fixed-site", "diag_chain_parts.py")])
def test_the_whole_sanitizer_and_a_fixed_site_find_the_race_at_their_sites(part, site, tmp_path):
    """The fixed site is the tool's own line, so the native path did take the
    constant (an op sent to the Python body would capture the program's)."""
    line = _kinds(part, tmp_path)
    if not line.startswith("True"):
        pytest.skip("the native dispatch path is not built")
    assert "data_race" in line and line.endswith(f"['{site}']"), (part, line)


@pytest.mark.parametrize("part", ["no-feed", "no-access"])
def test_parts_that_switch_the_model_off_find_nothing(part, tmp_path):
    line = _kinds(part, tmp_path)
    if not line.startswith("True"):
        pytest.skip("the native dispatch path is not built")
    assert line.endswith("[] []"), (part, line)
