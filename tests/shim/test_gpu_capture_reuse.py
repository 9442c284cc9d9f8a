"""torch's graph_capture_record_stream_reuse (test_graph_capture_reclaim_2_streams
and _4_streams of torch's test_cuda.py) under the shim, with torch's own
allocator as the control, each in a fresh process; and the graph's replays
read the right values.  The simulated runtime's version of the same rules:
tests/shim/test_shim_capture_reuse.py.  Skipped without CUDA."""
import pytest

from helpers.gpu_helpers import requires_cuda, run_program

pytestmark = requires_cuda
ALLOCATORS = ["shim", "native"]


def assert_reused_only_after_the_join(r):
    """A program's result: no findings, the freed block not reused before the join, reused after it, replays right."""
    assert r["findings"] == []
    assert not r["before_join_reused"]
    assert r["after_join_reused"]
    assert r["replays_ok"] == [True] * 10


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_two_streams_reuse_only_after_the_join(allocator):
    r = run_program("capture_reuse_programs.py", "two_streams", allocator, "on")
    assert_reused_only_after_the_join(r)
    if allocator == "shim":
        assert r["backend"] == "npu_lifetime" and r["setting_seen_by_shim"] is True


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_four_streams_reuse_only_after_the_final_join(allocator):
    assert_reused_only_after_the_join(run_program("capture_reuse_programs.py", "four_streams", allocator, "on"))


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_with_the_setting_off_the_block_waits_for_the_capture_end(allocator):
    r = run_program("capture_reuse_programs.py", "two_streams", allocator, "off")
    assert r["findings"] == []
    assert not r["before_join_reused"] and not r["after_join_reused"]
    assert r["replays_ok"] == [True] * 10
    if allocator == "shim":
        assert r["setting_seen_by_shim"] is False
