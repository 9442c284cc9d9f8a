"""Expandable segments on a real GPU (skipped without one): torch's
test_mempool_expandable scenario, in-place growth with contents intact and
empty_cache giving pages back, and a recorded stream's block kept mapped
until that stream is done; under the shim and, as the control, under
torch's own allocator, in fresh processes."""
import pytest
from helpers.gpu_helpers import requires_cuda, run_program

pytestmark = requires_cuda
ALLOCATORS = ["shim", "native"]


def run(program, allocator):
    r = run_program("expandable_programs.py", program, allocator)
    if allocator == "shim":
        assert r["backend"] == "npu_lifetime", r  # the CUDA bridge: it follows torch's setting
    return r


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_mempool_expandable(allocator):
    r = run("mempool_expandable", allocator)
    assert r["segments"] == 2 and r["expandable"] == 1, r
    assert r["dummy_allocs"] == 1, "the pool's own allocator served the pool's segment"
    assert r["findings"] == []


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_growth_in_place_and_empty_cache_unmaps(allocator):
    r = run("growth", allocator)
    assert r["in_place"] and r["intact"], r
    assert r["expandable_segments"] == 1
    assert r["reserved_after"] < r["reserved_full"]
    assert r["findings"] == []


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_a_recorded_streams_block_stays_mapped_until_it_is_done(allocator):
    r = run("record_stream_then_empty_cache", allocator)
    assert r["sum_ok"] and r["findings"] == []
