"""The hand-off harness on real CUDA streams, and record_use under
torch.compile (skipped without a GPU)."""
import pytest
import torch

import npu_lifetime

from helpers.gpu_helpers import requires_cuda, run_program

pytestmark = requires_cuda


@pytest.fixture(scope="module")
def runs():
    return {(r["handoff"], r["policy"]): r for r in run_program("handoff_programs.py", "harness")}


def test_correct_handoffs_are_clean_and_agree(runs):
    for key in [("record_stream", "poll"), ("recipe", "poll"), ("record_use", "poll"),
                ("record_use", "stream_wait"), ("record_stream", "stream_wait")]:
        assert runs[key]["findings"] == [] and runs[key]["same_outputs"], key


def test_record_use_with_stream_wait_uses_no_more_memory_than_the_recipe(runs):
    assert runs[("record_use", "stream_wait")]["peak_active_bytes"] <= runs[("recipe", "poll")]["peak_active_bytes"]


def test_broken_handoffs_are_reported_on_the_gpu(runs):
    for name in ["broken: drop outside the owner stream context", "broken: stash dropped too early",
                 "broken: record_use before the last read"]:
        assert runs[(name, "poll")]["findings"] == ["uncovered_free"], name
    assert runs[("inefficient: consumer event recorded late", "poll")]["findings"] == []


def test_handoff_command_on_cuda_shows_the_broken_rows_corrupting_and_the_correct_rows_intact():
    """``npu-lifetime handoff --device cuda``: the debug column is the GPU's
    own run, every consumer sleeping before its last read."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from helpers.handoff_table_check import assert_device_table

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-m", "npu_lifetime.cli", "handoff", "--device", "cuda", "--layers", "3",
                           "--width", "128", "--fsdp2", "no"], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, PYTHONPATH=str(root)), cwd=str(root))
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert_device_table(done.stdout, "cuda")


def test_record_use_traces_under_torch_compile_fullgraph():
    side = torch.cuda.Stream()

    @torch.compile(fullgraph=True, backend="aot_eager")
    def step(x):
        y = x * 2
        npu_lifetime.record_use(x, side)
        return y

    from npu_lifetime.recording.torch_allocator_fallback import FALLBACK

    fallback = FALLBACK.for_device("cuda")
    before = fallback.counts["recorded"]  # counts: a copy, read it again after
    x = torch.ones(8, device="cuda")
    assert torch.equal(step(x), torch.full((8,), 2.0, device="cuda"))
    assert fallback.counts["recorded"] == before + 1  # the compiled graph ran the op


def test_record_use_op_survives_inductor():
    side = torch.cuda.Stream()
    from torch._inductor.utils import run_and_get_code

    @torch.compile(fullgraph=True)
    def step(x):
        npu_lifetime.record_use(x, side)
        return x + 1

    _, code = run_and_get_code(step, torch.ones(8, device="cuda"))
    assert any("npu_lifetime.record_use" in c for c in code)
