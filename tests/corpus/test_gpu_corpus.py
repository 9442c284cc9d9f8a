"""The corpus of real programs (examples/) under the sanitizer on CUDA, and
on 2 GPUs over NCCL for DDP and FSDP2.  Each prints its JSON summary (for
the design note).  Passing: every program runs, and no finding fails the
check (every race and uncovered free, latent or actual); FSDP2's known-safe
latent frees are silenced by the example's suppressions file, and each
comes with its reason."""
import json

import pytest
import torch

from helpers.corpus_helpers import run_distributed, run_single
from helpers.gpu_helpers import requires_cuda

pytestmark = requires_cuda
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")


@pytest.mark.parametrize("name, args", [
    ("prefetch_loader", ["--steps", "20"]),
    ("offload_activations", ["--steps", "5"]),
    ("compiled_side_stream", ["--steps", "10"]),  # inductor: the graph's kernels are not visible, its allocations are
])
def test_single_gpu_programs(name, args):
    result = run_single(name, "cuda", *args)
    print(json.dumps(result, indent=2))
    assert result["failing"] == {}, "\n\n".join(result["reports"])


@two_gpus
@pytest.mark.parametrize("name", ["ddp_sanitized", "fsdp2_sanitized"])
def test_distributed_programs_on_two_gpus(name, tmp_path):
    reports = run_distributed(name, "cuda", tmp_path, "--steps", "3")
    print(json.dumps(reports, indent=2))
    for report in reports:
        assert len(report["losses"]) == 3 and all(loss == loss for loss in report["losses"])
        assert report["failing"] == {}, "\n\n".join(report["reports"])
        if report["findings"].get("uncovered_free"):
            assert report["latent_reasons"], report  # every latent free says why
            # silenced only by the example's explicit rule
            assert all(why.startswith("suppressed by latent_free:src:*/torch/distributed/fsdp/*")
                       for why in report["silenced"]), report
