"""Verdicts of issue 17 that only a GPU can show (they skip without one):
nonzero's output written after its host sync, and a prefetch with no hand-off
that the shim's hold made latent still failing the check."""
import gc
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

import npu_lifetime
from npu_lifetime.sanitizer import LifetimeSanitizer

from helpers.gpu_helpers import requires_cuda

pytestmark = requires_cuda
ROOT = Path(__file__).resolve().parents[2]


def test_nonzero_output_read_on_another_stream_without_a_wait_races():
    """nonzero on s2 reads its input, synchronises the host for the output's
    size, then writes the output: a read on s1 with no wait races with it."""
    san = LifetimeSanitizer("cuda", on_race="collect", warn_on_free=False)
    with san:
        s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
        x = torch.ones(1 << 12, device="cuda")
        s2.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s2):
            out = x.nonzero()
        npu_lifetime.record_use(x, s2)
        with torch.cuda.stream(s1):
            out.sum()  # no wait for s2
        npu_lifetime.record_use(out, s1)
        del x, out
        torch.cuda.synchronize()
        gc.collect()
    races = [f for f in san.flush() if f.kind == "data_race"]
    assert [(r.access.op, r.prior.op) for r in races] == [("aten::sum", "aten::nonzero")], san.report(races)


PREFETCH = """
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256)).cuda()
copy_stream = torch.cuda.Stream()
batches = [torch.randn(64, 256).pin_memory() for _ in range(8)]


def prefetch(batch):
    with torch.cuda.stream(copy_stream):
        return batch.cuda(non_blocking=True)  # allocated on the copy stream


nxt = prefetch(batches[0])
for i in range(len(batches)):
    torch.cuda.current_stream().wait_stream(copy_stream)
    x = nxt  # used on the default stream, freed at the next iteration with no record_stream
    if i + 1 < len(batches):
        nxt = prefetch(batches[i + 1])
    loss = model(x).pow(2).mean()
    loss.backward()
print("loss", float(loss))
"""


def _check(tmp_path, *options):
    script = tmp_path / "prefetch.py"
    script.write_text(textwrap.dedent(PREFETCH))
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, "-m", "npu_lifetime.cli", "check", "--device", "cuda", *options,
                           str(script)], capture_output=True, text=True, env=env, timeout=600)


def test_a_prefetch_without_record_stream_fails_under_torchs_allocator_and_under_the_shim(tmp_path):
    plain = _check(tmp_path)
    assert plain.returncode == 1, plain.stdout[-4000:] + plain.stderr[-2000:]
    assert "[uncovered free" in plain.stdout
    shim = _check(tmp_path, "--shim")
    assert shim.returncode == 1, shim.stdout[-4000:] + shim.stderr[-2000:]
    assert "[uncovered free" in shim.stdout
    # the shim's hold never counts as safe, even when latent frees are allowed
    allowed = _check(tmp_path, "--shim", "--allow-latent")
    assert allowed.returncode == 1, allowed.stdout[-4000:] + allowed.stderr[-2000:]
    assert "only the shim's protection" in allowed.stdout or "ACTUAL" in allowed.stdout
