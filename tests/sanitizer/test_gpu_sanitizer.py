"""The sanitizer on real CUDA streams, beyond the table (which runs on CUDA
in test_sanitizer_table.py): address reuse, retention, the shim."""
import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import npu_lifetime
from npu_lifetime.lifetime import UncoveredFree
from npu_lifetime.sanitizer import LifetimeSanitizer

from helpers.gpu_helpers import requires_cuda, run_program
from helpers.pasted_fixes import assert_each_fix_passes
from helpers.scripts import missing_handoff_on
from helpers.stream_devices import CudaDevice, used_on_side

pytestmark = requires_cuda


def test_a_reused_address_does_not_inherit_recorded_streams():
    san = LifetimeSanitizer("cuda", on_race="collect", warn_on_free=False)
    with san:
        side = torch.cuda.Stream()
        x = torch.ones(1 << 16, device="cuda")
        address = x.data_ptr()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            x.sum()
        x.record_stream(side)
        del x
        torch.cuda.synchronize()  # x's block becomes free again
        y = torch.ones(1 << 16, device="cuda")
        assert y.data_ptr() == address
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            y.sum()
        del y  # nothing covers this use: x's record_stream is not y's
        gc.collect()
    [f] = san.flush()
    assert isinstance(f, UncoveredFree) and f.address == address and not f.live


def test_free_findings_survive_del_and_gc_and_a_disabled_sanitizer_is_silent():
    san = LifetimeSanitizer("cuda", on_race="collect", warn_on_free=False)
    with san:
        x, side = used_on_side(4096, CudaDevice, use=lambda x: (x * 2).sum())
        del x
        gc.collect()
    torch.cuda.synchronize()
    kinds = [f.kind for f in san.findings]
    assert kinds == ["uncovered_free"]
    quiet = LifetimeSanitizer("cuda", on_race="collect", warn_on_free=False)
    side = torch.cuda.Stream()
    x = torch.ones(4096, device="cuda")
    with torch.cuda.stream(side):
        x.sum()
    del x
    assert quiet.flush() == [] and [f.kind for f in san.flush()] == ["uncovered_free"]


def test_record_use_fallback_under_the_native_allocator_is_reclaimed():
    from npu_lifetime.recording import FALLBACK

    side = torch.cuda.Stream()
    x = torch.ones(1 << 20, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)
        x.sum()
    npu_lifetime.record_use(x, side)
    for _ in range(99):
        npu_lifetime.record_use(x, side)  # one live event per (storage, stream)
    assert FALLBACK.held() == 1
    del x
    torch.cuda.synchronize()
    FALLBACK.reclaim()  # under a sanitizer the calls (or reclaim) release, in the program's order
    assert FALLBACK.held() == 0


@pytest.mark.parametrize("bad", ["cpu", "other_device_stream", "freed"])
def test_record_use_rejects_bad_input(bad):
    from npu_lifetime.recording import RecordUseError

    x = torch.ones(4, device="cuda")
    if bad == "cpu":
        with pytest.raises(RecordUseError, match="cuda or npu tensor"):
            npu_lifetime.record_use(torch.ones(4), torch.cuda.current_stream())
    elif bad == "other_device_stream":
        if torch.cuda.device_count() < 2:
            pytest.skip("needs two GPUs")
        with pytest.raises(RecordUseError, match="is on"):
            npu_lifetime.record_use(x, torch.cuda.Stream(device=1))
    else:
        x.untyped_storage().resize_(0)
        with pytest.raises(RecordUseError, match="freed storage"):
            npu_lifetime.record_use(x)


def test_the_shim_defers_an_uncovered_free_the_sanitizer_found():
    r = run_program("sanitizer_programs.py", "uncovered_free_under_shim")
    assert r["sanitizer"] == ["uncovered_free"] and r["shim"] == ["unrecorded_use"]
    assert not r["reused"] and not r["corrupted"]


def test_shim_allocations_reach_the_sanitizer():
    r = run_program("sanitizer_programs.py", "table_under_shim")
    assert r == {"record_use": [], "none": ["uncovered_free"], "record_stream": []}


def test_the_shim_is_told_of_every_uncovered_use_under_warnings_as_errors():
    r = run_program("sanitizer_programs.py", "warnings_as_errors_under_shim")
    assert r["sanitizer"] == ["uncovered_free", "uncovered_free"]
    assert r["shim"] == ["unrecorded_use", "unrecorded_use"] and not r["reused"]


def test_a_reuse_race_under_the_native_allocator_is_actual_and_corrupts():
    r = run_program("sanitizer_programs.py", "reuse_race_native_allocator")
    assert r["reused"]  # the block really went to the new owner
    assert r["kinds"] == ["reuse_race", "uncovered_free"] and r["failing"] == ["reuse_race", "uncovered_free"]
    assert r["corrupted"]  # and the read on the side stream saw the new owner's data


def test_a_storage_from_before_enable_has_the_stream_the_allocator_reports():
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        x = torch.ones(1 << 16, device="cuda")  # allocated on side, before the sanitizer
    torch.cuda.synchronize()
    san = LifetimeSanitizer("cuda", on_race="collect", warn_on_free=False)
    with san:
        x.sum()  # on the default stream, not ordered after side: a race with nothing (made before)
        del x  # the default stream's use is uncovered: x belongs to side
        gc.collect()
    [f] = san.flush()
    assert isinstance(f, UncoveredFree) and f.alloc_stream == (0, side.cuda_stream) and f.usage_stream[1] == 0


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_a_cross_device_copy_runs_on_the_source_devices_stream():
    san = LifetimeSanitizer("cuda", on_race="collect", warn_on_free=False)
    with san:
        x = torch.ones(1 << 16, device="cuda:0")
        y = x.to("cuda:1")  # on cuda:0's current stream, with barriers both ways
        with torch.cuda.device(1):
            z = y * 2  # cuda:1's stream waited for the copy
        del x, y
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(1)
        gc.collect()
    found = [f for f in san.flush() if not getattr(f, "live", False)]
    assert found == [], san.report(found)
    assert z.device.index == 1


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_nccl_collectives_are_accesses_on_nccls_stream_ordered_by_wait(tmp_path):
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(root), PYTHONWARNINGS="ignore", NCCL_NVLS_ENABLE="0")
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
         str(root / "tests/platforms/gpu_programs/collective_programs.py"), str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    for rank in (0, 1):
        r = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert r["all_reduce_used_before_wait"]["races"] == ["aten::add_ after c10d::allreduce_"], r
        assert r["all_to_all_output_used_before_wait"]["races"] == ["aten::add_ after c10d::alltoall_base_"], r
        for clean in ("all_reduce_used_after_wait", "all_reduce_synchronous", "all_gather_into_tensor_after_wait"):
            assert r[clean]["failing"] == [] and r[clean]["races"] == [], r[clean]["report"]


def test_each_suggested_fix_on_cuda_pasted_into_the_script_makes_it_pass(tmp_path):
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(root), PYTHONWARNINGS="ignore")

    def check(path):
        return subprocess.run([sys.executable, "-m", "npu_lifetime.cli", "check", "--device", "cuda", str(path)],
                              capture_output=True, text=True, env=env, timeout=300)

    assert_each_fix_passes(check, missing_handoff_on("cuda", tmp_path),
                           ["npu_lifetime.record_use(x, side)", "x.record_stream(side)",
                            "torch.cuda.default_stream(0).wait_stream(side)"], tmp_path)


def test_two_streams_made_on_two_lines_are_named_by_their_own_lines():
    # torch fires a creation for every stream of the device's pool at the
    # first Stream() and none later (c10/cuda/CUDAStream.cpp): named by those
    # creations, every pool stream was `side` and `other` was `side` too
    san = LifetimeSanitizer("cuda", on_race="collect", warn_on_free=False)
    with san:
        side = torch.cuda.Stream()
        other = torch.cuda.Stream()
        current = torch.cuda.current_stream()  # wraps a stream that exists: names nothing
    codes = [san.names.stream_code(san.backend.stream_key(s)) for s in (side, other, current)]
    assert codes == ["side", "other", "torch.cuda.default_stream(0)"], codes
