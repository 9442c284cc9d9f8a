"""The shim installed into torch.cuda, on a real GPU (skipped without one)."""
import pytest

from helpers.gpu_helpers import requires_cuda, run_program

pytestmark = requires_cuda


def test_tensors_are_correct_and_blocks_cached():
    r = run_program("shim_programs.py", "basic")
    assert r["runtime"] == "cuda" and r["rel_error"] < 1e-3
    assert r["distinct_ptrs"] == 1 and r["cache_hits"] >= 99
    assert r["findings"] == []


@pytest.mark.parametrize("allocator", ["native", "shim"])
def test_without_record_calls_the_late_reader_sees_corruption(allocator):
    r = run_program("shim_programs.py", "handoff", allocator, "none")
    assert r["reused"] and r["corrupted"]


@pytest.mark.parametrize("mode", ["record_stream", "record_use"])
def test_shim_poll_policy_protects_the_late_reader(mode):
    r = run_program("shim_programs.py", "handoff", "shim", mode)
    assert not r["corrupted"] and not r["reused"] and r["findings"] == []


@pytest.mark.parametrize("mode", ["record_stream", "record_use"])
def test_shim_stream_wait_policy_reuses_at_once_and_stays_correct(mode):
    r = run_program("shim_programs.py", "handoff", "shim_stream_wait", mode)
    assert r["reused"] and not r["corrupted"]


def test_shim_lazy_wait_reuses_a_record_use_block_at_once_and_stays_correct():
    r = run_program("shim_programs.py", "handoff", "shim_lazy_wait", "record_use")
    assert r["reused"] and not r["corrupted"] and r["findings"] == []


def test_shim_lazy_wait_holds_a_record_stream_block_as_torch_does():
    r = run_program("shim_programs.py", "handoff", "shim_lazy_wait", "record_stream")
    assert not r["reused"] and not r["corrupted"] and r["findings"] == []


@pytest.mark.parametrize("mode", ["record_stream", "record_use"])
def test_native_allocator_with_record_calls(mode):
    r = run_program("shim_programs.py", "handoff", "native", mode)
    assert not r["corrupted"]


def test_tensor_record_stream_reaches_the_shim():
    r = run_program("shim_programs.py", "record_stream_reaches_shim")
    assert r["recorded"] == [r["side"]]


def test_install_after_cuda_was_used_is_a_clear_error():
    r = run_program("shim_programs.py", "late_install")
    assert r["error"] == "InstallError" and "before any cuda tensor" in r["message"]


@pytest.mark.parametrize("policy", ["lazy_wait", "poll"])
def test_out_of_memory_is_torchs_error_and_the_program_goes_on(policy):
    r = run_program("shim_programs.py", "out_of_memory", policy)
    assert r["bridge"] is not None
    assert r["error"] is not None and "npu_lifetime shim: out of memory on device 0" in r["error"]
    assert r["again_ok"] and r["tensor_still_fine"]
    assert r["ptr"] == 0 and r["findings"] == ["out_of_memory", "out_of_memory"] and r["num_ooms"] == 2
