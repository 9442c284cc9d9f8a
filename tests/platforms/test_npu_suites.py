"""The device-parametrised suites on the real torch_npu: each file runs in
the torch_npu environment over the stand-in CANN runtime (a pytest of its
own: that environment's torch loads torch_npu, which needs the stand-ins
before the interpreter starts), with only its npu cases selected.  Nothing
here runs on NPU hardware."""
import re
import subprocess

import pytest

from helpers.npu_helpers import REPO, npu_environment, require_npu_python


def run_npu_pytest(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    python = require_npu_python()
    return subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], capture_output=True,
                          text=True, timeout=timeout, env=npu_environment(), cwd=str(REPO))

# device-parametrised suites (stream_devices.DEVICES) and how many npu cases each must run
SUITES = {
    "test_sanitizer_table.py": 15,
    "test_sanitizer_record_stream_matrix.py": 17,
    "test_sanitizer_devices.py": 14,
}


@pytest.mark.parametrize("suite", sorted(SUITES))
def test_suite_passes_on_torch_npu(suite):
    done = run_npu_pytest(f"tests/sanitizer/{suite}", "-k", "npu")
    tail = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    passed = int(re.search(r"(\d+) passed", tail).group(1)) if "passed" in tail else 0
    assert passed >= SUITES[suite], tail  # the npu cases ran, not skipped
