"""NPU_LIFETIME_SANITIZER's start-up hook (issue 38, item 2): the
``.pth`` file the package installs at the top of site-packages (setup.py,
``BuildPyWithStartupHook``), as coverage.py's process start-up does, starts
the process-wide sanitizer in a program that imports nothing of
npu_lifetime; unset, it imports nothing.

The hook is tried in a fresh virtual environment whose site-packages holds
it, beside a path file reaching this environment's packages: the real
interpreter start-up, not an emulation of it."""
import os
import site
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HOOK = ROOT / "npu_lifetime" / "startup_hook.pth"
INSTALLED_NAME = "npu_lifetime_sanitizer.pth"  # setup.py's STARTUP_HOOK_NAME

SCRIPT = """
import sys
import torch
x = torch.ones(4) * 2
print("npu_lifetime imported:", "npu_lifetime" in sys.modules)
print("sanitizer started:", "npu_lifetime.sanitizer" in sys.modules)
"""


@pytest.fixture(scope="module")
def hooked_python(tmp_path_factory) -> str:
    venv = tmp_path_factory.mktemp("hooked") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    (packages,) = venv.glob("lib/python3*/site-packages")
    (packages / "reach_this_environment.pth").write_text(f"{site.getsitepackages()[0]}\n{ROOT}\n")
    (packages / INSTALLED_NAME).write_text(HOOK.read_text())
    return str(venv / "bin" / "python")


def _run(python: str, tmp_path: Path, value) -> str:
    script = tmp_path / "plain.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NPU_LIFETIME_") and k != "PYTHONPATH"}
    if value is not None:
        env["NPU_LIFETIME_SANITIZER"] = value
    done = subprocess.run([python, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_hook_starts_the_sanitizer_in_a_script_that_imports_nothing_of_npu_lifetime(hooked_python, tmp_path):
    out = _run(hooked_python, tmp_path, "sim")
    assert "sanitizer started: True" in out, out


@pytest.mark.parametrize("value", [None, "", "0", "off"])
def test_unset_or_off_the_hook_imports_nothing(hooked_python, tmp_path, value):
    out = _run(hooked_python, tmp_path, value)
    assert "sanitizer started: False" in out, out
    if not value:
        assert "npu_lifetime imported: False" in out, out  # a process without the variable pays nothing


def test_setup_puts_the_hook_at_the_top_of_site_packages():
    setup = (ROOT / "setup.py").read_text()
    assert f'STARTUP_HOOK_NAME = "{INSTALLED_NAME}"' in setup and '"build_py": BuildPyWithStartupHook' in setup
    line = HOOK.read_text().strip()
    assert line.startswith("import ") and "\n" not in line  # site runs a .pth line only when it starts with import
