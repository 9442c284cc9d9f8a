"""`npu-lifetime snapshot --device cuda` on a real GPU (skipped without one):
the pickle torch's reader opens, with the script's record_use and
record_stream in the trace and its own lines as frames; the timeline."""
import os
import pickle
import subprocess
import sys
from pathlib import Path

import torch.cuda._memory_viz as torch_viz
from helpers.gpu_helpers import PROGRAMS, requires_cuda

from npu_lifetime.viz import memory_viz

pytestmark = requires_cuda
SCRIPT = str(PROGRAMS / "snapshot_script.py")


def test_snapshot_of_a_cuda_script(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    prefix = tmp_path / "snap"
    done = subprocess.run([sys.executable, "-m", "npu_lifetime.cli", "snapshot", "--device", "cuda",
                           "--out", str(prefix), SCRIPT], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "runtime cuda" in done.stdout and "done" in done.stdout
    with open(f"{prefix}.pickle", "rb") as f:
        data = pickle.load(f)
    assert memory_viz.replay_problems(data) == []
    assert "total_reserved" in torch_viz.segsum(data)
    trace = data["device_traces"][0]
    actions = [e["action"] for e in trace]
    assert "alloc" in actions and "free_requested" in actions and "free_completed" in actions
    recorded = [e for e in trace if e["action"] in ("record_use", "record_stream")]
    assert {e["action"] for e in recorded} == {"record_use", "record_stream"}
    for e in recorded:  # recorded on the side stream, not on the block's allocation stream
        owner = [a for a in trace[:trace.index(e)] if a["action"] == "alloc" and a["addr"] == e["addr"]][-1]
        assert e["stream"] != owner["stream"]
    user = [f for e in trace if e["action"] == "alloc" for f in e["frames"] if f["filename"] == SCRIPT]
    assert user, "no allocation carries the script's own frames"
    html = (tmp_path / "snap.html").read_text()
    assert html.count('class="lanename"') >= 2 and "record_use" in html
