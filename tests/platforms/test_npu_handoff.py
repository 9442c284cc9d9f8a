"""``npu-lifetime handoff --device npu`` on the real torch_npu over the
stand-in CANN runtime, at torch_npu's default task queue (one process).

Each hand-off runs under the sanitizer at every policy, and once more on the
NPU itself with the shim in debug mode and every consumer sleeping
(torch.npu._sleep, 50 ms on the stand-in) before its last read: the stand-in
runs each stream on its own worker, so a buffer freed under that read is
poisoned before it and the read sees NaN.  The broken rows must be reported
and read the poison; the correct ones (and the too-late event, safe by
design) must be clean and read their data.  Nothing here runs on NPU
hardware."""
import subprocess

from helpers.handoff_table_check import assert_device_table
from helpers.npu_helpers import REPO, npu_environment, require_npu_python


def test_handoff_table_on_npu_shows_the_broken_rows_corrupting_and_the_correct_rows_intact():
    done = subprocess.run([require_npu_python(), "-m", "npu_lifetime.cli", "handoff", "--device", "npu",
                           "--layers", "2", "--width", "16", "--fsdp2", "no"],
                          capture_output=True, text=True, timeout=600, env=npu_environment(), cwd=str(REPO))
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert_device_table(done.stdout, "npu")
