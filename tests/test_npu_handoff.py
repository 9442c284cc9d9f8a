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
import re
import subprocess

from npu_helpers import REPO, npu_environment, require_npu_python

CORRECT = ("record_stream", "recipe", "record_use", "broken: consumer event recorded too late")
BROKEN = ("broken: drop outside the owner stream context", "broken: stash dropped too early",
          "broken: record_use before the last read")
ROW = re.compile(r"^(?P<handoff>\S.*?)\s{2,}(?P<policy>poll|stream_wait|lazy_wait)\s+(?P<findings>.+?)\s+\d+\s+[\d.]+"
                 r"\s+(?P<outputs>same|DIFFER)\s+(?P<late>corrupts|safe)\s+(?P<debug>poison|data|other|-)\s+"
                 r"(?P<verdict>ok|UNEXPECTED):")


def test_handoff_table_on_npu_shows_the_broken_rows_corrupting_and_the_correct_rows_intact():
    done = subprocess.run([require_npu_python(), "-m", "npu_lifetime.cli", "handoff", "--device", "npu",
                           "--layers", "2", "--width", "16", "--fsdp2", "no"],
                          capture_output=True, text=True, timeout=600, env=npu_environment(), cwd=str(REPO))
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    out = done.stdout
    assert "device npu" in out and "debug: what the device itself did" in out and "torch.npu._sleep" in out
    rows = [m.groupdict() for m in map(ROW.match, out.splitlines()) if m]
    by_name = {}
    for row in rows:
        by_name.setdefault(row["handoff"], []).append(row)
    assert set(by_name) == set(CORRECT + BROKEN), out
    assert {r["policy"] for r in by_name["record_use"]} == {"poll", "stream_wait", "lazy_wait"}
    for name in BROKEN:
        for row in by_name[name]:
            assert row["debug"] == "poison", row  # the NPU's late read saw its buffer freed under it
            assert "uncovered_free" in row["findings"] and row["verdict"] == "ok", row
    for name in CORRECT:
        for row in by_name[name]:
            assert row["debug"] == "data" and row["outputs"] == "same", row  # intact on the NPU
            assert row["findings"] == "-" and row["verdict"] == "ok", row
    assert "as expected" in out and "on the npu itself" in out and "UNEXPECTED" not in out
