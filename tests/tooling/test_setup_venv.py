"""tools/setup_venv.sh: the README's set-up and CI's (issue 19).

Before it, the README's line pointed pip at PyPI's CPU wheel index whether
or not it could be reached: where it cannot, pip retried it for every
package (50 warnings, about 70 s on an idle 2-core machine, 160 s loaded),
and with no CPU build elsewhere it took the 2.74 GB CUDA build.  CI ran
other install commands than the README's.

The script runs here with a stand-in ``python3`` whose ``-m venv`` makes a
virtual environment with a recording ``pip``: what matters is which pip
commands it runs, and how long it takes to decide.
"""
from __future__ import annotations

import http.server
import os
import re
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "setup_venv.sh"

FAKE_PYTHON3 = """#!/bin/sh
# python3 -m venv DIR: DIR/bin/python is the real one, DIR/bin/pip records its arguments
if [ "$1" != -m ] || [ "$2" != venv ]; then exec {real} "$@"; fi
mkdir -p "$3/bin"
ln -sf {real} "$3/bin/python"
cat > "$3/bin/pip" <<'EOF'
#!/bin/sh
echo "$*" >> "$PIP_LOG"
if [ -n "$PIP_FAILS" ] && [ "$1 $2" = "install $NPL_TORCH_SEEN" ]; then exit 1; fi
exit 0
EOF
chmod +x "$3/bin/pip"
"""


def run_setup(tmp_path: Path, index: str, *options: str, fails: bool = False):
    """(the finished process, the pip commands it ran, seconds)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "python3"
    fake.write_text(FAKE_PYTHON3.replace("{real}", os.path.realpath(os.sys.executable)))
    fake.chmod(0o755)
    log = tmp_path / "pip.log"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "NPL_TORCH_INDEX": index, "PIP_LOG": str(log),
           "PIP_FAILS": "1" if fails else "", "NPL_TORCH_SEEN": "torch==2.13.0+cpu"}
    env.pop("NPL_TORCH", None)
    start = time.monotonic()
    done = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "venv"), *options], capture_output=True, text=True,
                          env=env, timeout=60)
    seconds = time.monotonic() - start
    return done, log.read_text().splitlines() if log.exists() else [], seconds


def refused_port() -> int:
    with socket.socket() as s:  # bound, closed: nothing listens there
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def cpu_index():
    """An index that answers (HEAD .../torch/ -> 200)."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):
            self.send_response(200 if self.path.endswith("/torch/") else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/whl/cpu"
    server.shutdown()


def test_an_unreachable_cpu_index_is_asked_once_then_left_out(tmp_path):
    index = f"http://127.0.0.1:{refused_port()}/whl/cpu"
    done, pip, seconds = run_setup(tmp_path, index)
    assert done.returncode == 0, done.stderr
    assert pip == ["install torch==2.13.0+cpu", "install -e .[test]"]  # pip never sees the index
    assert f"setup: {index} cannot be reached from here" in done.stderr
    assert seconds < 20


def test_an_index_that_never_answers_costs_at_most_5_seconds(tmp_path):
    with socket.socket() as silent:  # accepts connections (the kernel's backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        index = f"http://127.0.0.1:{silent.getsockname()[1]}/whl/cpu"
        done, pip, seconds = run_setup(tmp_path, index)
    assert done.returncode == 0 and "cannot be reached from here (timed out)" in done.stderr
    assert pip == ["install torch==2.13.0+cpu", "install -e .[test]"]
    assert 4.5 < seconds < 20


def test_a_reachable_index_is_searched_beside_pips_own(tmp_path, cpu_index):
    done, pip, _ = run_setup(tmp_path, cpu_index)
    assert done.returncode == 0 and "cannot be reached" not in done.stderr
    assert pip == [f"install torch==2.13.0+cpu --extra-index-url {cpu_index}", "install -e .[test]"]


def test_pip_options_go_to_both_installs(tmp_path, cpu_index):
    _, pip, _ = run_setup(tmp_path, cpu_index, "--quiet", "--isolated")
    assert pip == [f"install torch==2.13.0+cpu --extra-index-url {cpu_index} --quiet --isolated",
                   "install -e .[test] --quiet --isolated"]


def test_npu_installs_torch_npu_with_the_cpu_torch_in_one_resolution(tmp_path, cpu_index):
    """--npu (issue 38, item 5): torch_npu's torch==2.13.0 is met by the CPU
    build in the same pip run, never PyPI's CUDA build; --npu is not a pip option."""
    _, pip, _ = run_setup(tmp_path, cpu_index, "--npu", "--quiet")
    assert pip == [f"install torch==2.13.0+cpu torch_npu==2.13.0 --extra-index-url {cpu_index} --quiet",
                   "install -e .[test] --quiet"]


def test_no_cpu_build_anywhere_stops_before_any_download_and_says_what_to_do(tmp_path):
    index = f"http://127.0.0.1:{refused_port()}/whl/cpu"
    done, pip, _ = run_setup(tmp_path, index, fails=True)
    assert done.returncode == 1
    assert pip == ["install torch==2.13.0+cpu"]  # pinned to the CPU build: never the CUDA build by itself
    assert "pip found no torch==2.13.0+cpu (torch's CPU build)" in done.stderr
    assert f"NPL_TORCH=torch==2.13.0 tools/setup_venv.sh {tmp_path / 'venv'}" in done.stderr


def test_the_readme_and_ci_set_up_with_the_same_command():
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", readme, re.S)
    commands = [line for block in blocks for line in block.splitlines() if line and not line.startswith("#")]
    assert any(line.startswith("tools/setup_venv.sh && ") for line in commands), commands  # set-up + main job
    assert all(line.startswith(("tools/setup_venv.sh", ".venv")) for line in commands), commands  # no other set-up
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^tools/setup_venv\.sh \.venv --quiet$", ci, re.M)
    installs = [line for line in ci.splitlines() if "pip install" in line and not line.lstrip().startswith("#")]
    assert all(line.startswith(".venv-npu/") for line in installs), installs  # .venv only through the script
