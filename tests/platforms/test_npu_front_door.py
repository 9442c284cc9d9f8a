"""``npu-lifetime`` in the NPU environment (``.venv-npu``) without CANN
(issue 38, item 5): ``--device npu`` runs the user's script over the
stand-in CANN runtime with no ``eval``, saying in one line that it is the
stand-in and not NPU hardware; where no stand-in can be built, one line and
exit 2; never torch's traceback.  Nothing here runs on NPU hardware."""
import os
import subprocess
from pathlib import Path

import pytest

from helpers.npu_helpers import ON_STANDIN, require_npu_python
from helpers.scripts import forgotten_handoff, missing_handoff_on, write_script

pytestmark = pytest.mark.skipif(not ON_STANDIN, reason="a machine with CANN never uses the stand-in")

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
STANDIN_LINE = ("npu-lifetime: no CANN runtime here: running torch_npu over the stand-in CANN runtime "
                "(tests/platforms/npu_standin, a CPU model for tests), not on NPU hardware")


def _as_a_user(*args, env=None, cwd=None) -> subprocess.CompletedProcess:
    """The environment's own npu-lifetime, from a shell with nothing set up
    (no stand-in variables: no `eval "$(build.py --print-env)"`)."""
    entry = Path(require_npu_python()).parent / "npu-lifetime"
    if not entry.exists():
        pytest.skip(f"{entry} is missing: the NPU environment has no npu-lifetime command")
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("NPU_STANDIN_", "NPU_LIFETIME_", "TORCH_DEVICE_BACKEND")) and k != "LD_LIBRARY_PATH"}
    return subprocess.run([str(entry), *args], capture_output=True, text=True, timeout=600,
                          env=dict(clean, **(env or {})), cwd=cwd)


def _no_traceback(done: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in done.stderr and "Failed to load the backend extension" not in done.stderr, \
        done.stderr[-3000:]


def test_check_on_npu_runs_the_users_script_on_the_stand_in_and_says_so(tmp_path):
    done = _as_a_user("check", "--device", "npu", str(missing_handoff_on("npu", tmp_path)))
    _no_traceback(done)
    assert done.stderr.splitlines()[0] == STANDIN_LINE
    assert done.returncode == 1, done.stdout + done.stderr[-3000:]  # the forgotten hand-off, found
    assert "uncovered free" in done.stdout and "npu_lifetime.record_use(x, side)" in done.stdout


def test_the_readmes_gpu_example_on_npu_passes_on_the_stand_in(tmp_path):
    """The README's cuda lines with torch.npu, as its NPU paragraph says."""
    block = README.split("```python\n")[2].split("```")[0]
    assert "torch.cuda.Stream()" in block
    script = tmp_path / "handoff_npu.py"
    script.write_text("import torch\nimport torch_npu\nimport npu_lifetime\n" + block.replace("cuda", "npu"))
    done = _as_a_user("check", "--device", "npu", str(script), cwd=tmp_path)
    _no_traceback(done)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "npu_lifetime: no findings" in done.stdout and STANDIN_LINE in done.stderr


def test_the_simulated_device_runs_without_torch_npu(tmp_path):
    done = _as_a_user("check", "--device", "sim", write_script(tmp_path, forgotten_handoff()))
    _no_traceback(done)
    assert done.returncode == 1 and "uncovered free" in done.stdout, done.stdout + done.stderr[-3000:]
    assert STANDIN_LINE not in done.stderr


def test_without_a_stand_in_to_build_it_is_one_line_and_exit_2(tmp_path):
    done = _as_a_user("check", "--device", "npu", str(missing_handoff_on("npu", tmp_path)),
                      env={"NPU_STANDIN_CACHE": str(tmp_path / "cache"), "CC": str(tmp_path / "no-cc")})
    _no_traceback(done)
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("npu-lifetime")]
    assert line.startswith("npu-lifetime check: --device npu: torch_npu is installed but CANN is not")
    assert "C compiler" in line and "no-cc" in line
