"""torch's FSDP2 on 2 GPUs over NCCL, its hand-offs as shipped and migrated
to record_use (npu_lifetime.fsdp2), under the shim and under the native
allocator (skipped with fewer than 2 GPUs).  One torchrun launch per
allocator runs every phase of examples/fsdp2_record_use.py; each test reads
its part of the per-rank reports, which are printed for the record.  Only
what is deterministic is tested (losses, peaks, findings): the step time is
a benchmark, benchmarks/bench_fsdp2.py (a timed test here was flaky:
unchanged code ranged 0.878-1.051)."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from npu_lifetime.fsdp2 import BROKEN_NO_RECORD_USE, BROKEN_RECORD_USE_EARLY, MODES, RECIPE, RECORD_USE

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")

LOSS_RTOL = 1e-6  # same kernels in the same order: identical in practice; this bounds any reordering


def _launch(tmp_path_factory, allocator: str, phases: str) -> list:
    out = tmp_path_factory.mktemp(f"fsdp2_{allocator}")
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore", NCCL_NVLS_ENABLE="0",
               TORCH_SYMM_MEM_DISABLE_MULTICAST="1")
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
         str(ROOT / "examples/fsdp2_record_use.py"), "--device", "cuda", "--allocator", allocator,
         "--phases", phases, "--json", str(out)],
        capture_output=True, text=True, env=env, timeout=900,
    )
    assert done.returncode == 0, done.stderr[-6000:]
    reports = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    print(json.dumps(reports, indent=1))
    return reports


@pytest.fixture(scope="module")
def shim_run(tmp_path_factory):
    return _launch(tmp_path_factory, "shim", "timing,sanitizer,pressure,hsdp")


@pytest.fixture(scope="module")
def native_run(tmp_path_factory):
    return _launch(tmp_path_factory, "native", "timing,sanitizer")


def _close(a, b) -> bool:
    return len(a) == len(b) and all(math.isfinite(x) and abs(x - y) <= LOSS_RTOL * abs(y) for x, y in zip(a, b))


def _phase(report, name):
    assert name not in report["errors"], report["errors"][name]
    return report[name]


def test_every_phase_ran(shim_run):
    for report in shim_run:
        assert report["errors"] == {}, report["errors"]
        assert report["fsdp2_profile"] == "2.11" or report["torch"].startswith(report["fsdp2_profile"])


def test_losses_identical_migrated_and_original(shim_run):
    for report in shim_run:
        timing = _phase(report, "timing")
        assert _close(timing[RECORD_USE]["losses"], timing[RECIPE]["losses"])
        assert timing[RECIPE]["losses_same_every_round"] and timing[RECORD_USE]["losses_same_every_round"]
        assert timing[RECORD_USE]["record_use_calls_per_run"]["all_gather_output"] > 0
        assert timing[RECORD_USE]["record_use_calls_per_run"]["reduce_scatter_input"] > 0


def test_migrated_peak_memory_not_above_the_original(shim_run):
    for report in shim_run:
        timing = _phase(report, "timing")
        assert timing[RECIPE]["peak_active_bytes"] > 0  # this rank's device was measured
        assert timing[RECORD_USE]["peak_active_bytes"] <= timing[RECIPE]["peak_active_bytes"]


def test_sanitizer_clean_both_ways(shim_run):
    # "clean": nothing but FSDP2's latent gradient frees at zero_grad, which
    # both ways share (the next reduce-scatter makes its stream wait first)
    for report in shim_run:
        sanitizer = _phase(report, "sanitizer")
        for mode in (RECIPE, RECORD_USE):
            assert sanitizer[mode]["findings"]["unexpected"] == {}, (mode, sanitizer[mode]["findings"])
        assert sanitizer[RECORD_USE]["findings"]["at_free"] == sanitizer[RECIPE]["findings"]["at_free"]


@pytest.mark.parametrize("mode", [BROKEN_NO_RECORD_USE, BROKEN_RECORD_USE_EARLY])
def test_broken_migrations_are_caught_by_the_sanitizer(shim_run, mode):
    for report in shim_run:
        found = _phase(report, "sanitizer")[mode]["findings"]["unexpected"]
        assert found and all(k.startswith("uncovered_free") for k in found), found


@pytest.mark.parametrize("mode", [BROKEN_NO_RECORD_USE, BROKEN_RECORD_USE_EARLY])
def test_broken_migrations_corrupt_training_under_memory_pressure(shim_run, mode):
    runs = [_phase(report, "pressure")[mode] for report in shim_run]
    assert any(run["corrupted"] for run in runs), runs


@pytest.mark.parametrize("mode", [RECIPE, RECORD_USE])
def test_correct_hand_offs_survive_the_same_pressure(shim_run, mode):
    for report in shim_run:
        run = _phase(report, "pressure")[mode]
        assert run["fills_reusing_the_dropped_buffer"] > 0, run  # the pressure really reused freed buffers
        assert not run["corrupted"], run


def test_hsdp_all_reduce_hand_off(shim_run):
    for report in shim_run:
        hsdp = _phase(report, "hsdp")
        assert hsdp["losses_identical"]
        assert hsdp[RECORD_USE]["record_use_calls"]["all_reduce_input"] > 0
        assert hsdp[RECIPE]["stashed"]["all_reduce_input"] > 0 and hsdp[RECORD_USE]["stashed"]["all_reduce_input"] == 0
        for mode in (RECIPE, RECORD_USE):
            assert hsdp[mode]["findings"]["unexpected"] == {}, (mode, hsdp[mode]["findings"])


def test_native_allocator_fallback_trains_identically_and_cleanly(native_run):
    for report in native_run:
        timing = _phase(report, "timing")
        assert _close(timing[RECORD_USE]["losses"], timing[RECIPE]["losses"])
        sanitizer = _phase(report, "sanitizer")
        assert sanitizer[RECORD_USE]["findings"]["unexpected"] == {}
        assert set(MODES) == set(sanitizer)
