"""The corpus of publicly reported bugs on CUDA: the sanitizer's verdicts,
the data under the shim's debug mode with a slow kernel, and compute-
sanitizer's verdicts (torch's cudaMallocAsync backend, stream-ordered race
tracking) on every form, in one table (printed: the note quotes it)."""
import json
import shutil
import subprocess
import sys

import pytest

from helpers.gpu_helpers import requires_cuda

pytestmark = requires_cuda


def _corpus(*args, timeout=900):
    return subprocess.run([sys.executable, "-m", "npu_lifetime.cli", "corpus", "--device", "cuda", *args],
                          capture_output=True, text=True, timeout=timeout)


def test_corpus_on_cuda_with_the_debug_shim(tmp_path):
    done = _corpus("--corruption", "--json", str(tmp_path / "corpus.json"))
    print(done.stdout)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    rows = json.loads((tmp_path / "corpus.json").read_text())
    assert len(rows) >= 9
    for row in rows:
        assert row["status"] in ("caught", "known gap"), row
        assert row["corruption"]["buggy"] is False and all(
            ok is True for form, ok in row["corruption"].items() if form != "buggy"), row


@pytest.mark.skipif(shutil.which("compute-sanitizer") is None, reason="needs compute-sanitizer")
def test_compute_sanitizer_agrees_on_every_lifetime_case(tmp_path):
    done = _corpus("--compute-sanitizer", "--json", str(tmp_path / "corpus.json"), timeout=1500)
    print(done.stdout)
    rows = json.loads((tmp_path / "corpus.json").read_text())
    for row in rows:
        errors = row["oracle"]
        assert errors is not None, row
        assert all(n == 0 for form, n in errors.items() if form != "buggy"), row  # every fix is clean to it
        if "uncovered_free" in row["verdicts"]["buggy"]["kinds"]:
            assert errors["buggy"] > 0, row  # and every lifetime bug our sanitizer reports, it reports too
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
