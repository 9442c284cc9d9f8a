"""Switches that silently turned checking off (issue 38, items 1-3):
strings where booleans belong, NPU_LIFETIME_SANITIZER in a script that
imports only npu_lifetime, and NPU_LIFETIME_ALLOW_LATENT ignored by check
and the pytest marker."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from npu_lifetime import install
from npu_lifetime.sanitizer import LifetimeSanitizer

ROOT = Path(__file__).resolve().parents[2]

# a real bug: a forgotten hand-off (the free on the default stream while side's read may be queued)
HAND_OFF = textwrap.dedent("""
    side = sd.Stream()
    x = torch.ones(64)
    side.wait_stream(sd.default_stream())
    with sd.stream(side):
        y = x * 2
    del x
    gc.collect()
""")
IMPORTS = "import gc\nimport torch\nfrom npu_lifetime import simdevice as sd\n"
BUGGY = IMPORTS + "import npu_lifetime\n" + HAND_OFF + 'print("ran")\n'


@pytest.mark.parametrize("name", ["allow_latent", "strict", "warn_on_free"])
@pytest.mark.parametrize("value", ["no", "false", 0, 1, None])
def test_the_sanitizer_refuses_what_is_not_a_boolean(name, value):
    with pytest.raises(TypeError, match=f"{name} must be True or False"):
        LifetimeSanitizer("sim", **{name: value})


def test_install_and_the_sanitizer_refuse_alike():
    with pytest.raises(TypeError, match="debug must be True or False"):
        install("cuda", debug="yes")
    with pytest.raises(TypeError, match="allow_latent must be True or False"):
        LifetimeSanitizer("sim", allow_latent="yes")


def _run(args, env=None, cwd=None, timeout=300):
    full = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    for key in ("NPU_LIFETIME_SANITIZER", "NPU_LIFETIME_ALLOW_LATENT"):
        if env is None or key not in env:
            full.pop(key, None)
    return subprocess.run(args, capture_output=True, text=True, env=full, cwd=cwd, timeout=timeout)


def test_the_process_wide_sanitizer_checks_a_script_that_imports_only_npu_lifetime(tmp_path):
    script = tmp_path / "buggy.py"
    script.write_text(BUGGY)
    done = _run([sys.executable, str(script)], env={"NPU_LIFETIME_SANITIZER": "sim"})
    assert "ran" in done.stdout
    assert "uncovered free" in done.stderr, done.stderr[-2000:]
    assert done.returncode == 1


@pytest.mark.parametrize("value", ["1", "auto"])
def test_1_and_auto_mean_the_device_present(tmp_path, value):
    script = tmp_path / "buggy.py"
    script.write_text(BUGGY)
    done = _run([sys.executable, str(script)], env={"NPU_LIFETIME_SANITIZER": value})
    assert "DeviceUnavailable" not in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "uncovered free" in done.stderr
    assert done.returncode == 1


def test_an_unavailable_device_is_one_line_and_exit_2(tmp_path):
    script = tmp_path / "ok.py"
    script.write_text("import npu_lifetime\nprint('ran')\n")
    device = "npu" if not _has_npu() else "cuda"
    done = _run([sys.executable, str(script)], env={"NPU_LIFETIME_SANITIZER": device})
    if done.returncode == 0:
        pytest.skip(f"this machine has {device}")
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "Traceback" not in done.stderr


def _has_npu() -> bool:
    try:
        import torch_npu  # noqa: F401
        return True
    except Exception:  # noqa: BLE001
        return False


def test_check_honours_NPU_LIFETIME_ALLOW_LATENT(tmp_path):
    script = tmp_path / "buggy.py"
    script.write_text(BUGGY)
    cli = [sys.executable, "-m", "npu_lifetime.cli", "check", "--device", "sim", str(script)]
    failing = _run(cli)
    assert failing.returncode == 1, failing.stdout[-2000:] + failing.stderr[-2000:]
    allowed = _run(cli, env={"NPU_LIFETIME_ALLOW_LATENT": "1"})
    assert allowed.returncode == 0, allowed.stdout[-2000:] + allowed.stderr[-2000:]
    bad = _run(cli, env={"NPU_LIFETIME_ALLOW_LATENT": "maybe"})
    assert bad.returncode == 2 and "NPU_LIFETIME_ALLOW_LATENT must be 1 or 0" in bad.stderr


MARKED = IMPORTS + "import pytest\n\n\n@pytest.mark.lifetime_sanitizer(device=\"sim\", {option})\n" \
    "def test_forgotten_hand_off():\n" + textwrap.indent(HAND_OFF.replace("{", "{{").replace("}", "}}"), "    ")


@pytest.mark.parametrize("option", ['allow_latent="no"', 'strict="false"', 'live="yes"'])
def test_the_marker_refuses_strings_for_booleans(tmp_path, option):
    (tmp_path / "test_marked.py").write_text(MARKED.format(option=option))
    done = _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)], cwd=tmp_path)
    assert done.returncode == 1, done.stdout[-2000:]
    assert "must be True or False" in done.stdout, done.stdout[-2000:]


def test_the_marker_honours_NPU_LIFETIME_ALLOW_LATENT(tmp_path):
    (tmp_path / "test_marked.py").write_text(MARKED.format(option="strict=False"))
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)]
    assert _run(args, cwd=tmp_path).returncode == 1  # the latent free fails the test
    allowed = _run(args, env={"NPU_LIFETIME_ALLOW_LATENT": "1"}, cwd=tmp_path)
    assert allowed.returncode == 0, allowed.stdout[-2000:]
