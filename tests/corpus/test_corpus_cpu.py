"""The corpus of real programs (examples/) on the simulated device, with
gloo for the distributed ones: each must run and have no finding that fails
the check (the same programs run on CUDA / NCCL in test_gpu_corpus.py)."""
import pytest
import torch.distributed as dist

from helpers.corpus_helpers import run_distributed, run_single


@pytest.mark.parametrize("name, args", [
    ("prefetch_loader", ["--steps", "8"]),
    ("offload_activations", ["--steps", "2"]),
    ("compiled_side_stream", ["--steps", "3", "--backend", "aot_eager"]),  # aot_eager: fast to compile on CPU
])
def test_single_process_programs_are_clean(name, args):
    result = run_single(name, "sim", *args)
    assert result["failing"] == {}, "\n\n".join(result["reports"])
    assert result["findings"] == {}, "\n\n".join(result["reports"])


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")
@pytest.mark.parametrize("name", ["ddp_sanitized", "fsdp2_sanitized"])
def test_distributed_programs_are_clean_on_gloo(name, tmp_path):
    for report in run_distributed(name, "sim", tmp_path, "--steps", "2"):
        assert report["failing"] == {}, "\n\n".join(report["reports"])
        assert len(report["losses"]) == 2
