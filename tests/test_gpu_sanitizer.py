"""The sanitizer on real CUDA streams, beyond the table (which runs on CUDA
in test_sanitizer_table.py): address reuse, retention, the shim."""
import gc

import pytest
import torch

import npu_lifetime
from npu_lifetime.lifetime import UncoveredFree
from npu_lifetime.sanitizer import LifetimeSanitizer

from gpu_helpers import requires_cuda, run_program

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
        side = torch.cuda.Stream()
        x = torch.ones(4096, device="cuda")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            (x * 2).sum()
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
    FALLBACK.reclaim()  # no background thread (capture safety): reclaimed by calls
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
