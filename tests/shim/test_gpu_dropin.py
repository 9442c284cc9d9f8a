"""The shim as a drop-in allocator on a real GPU: torch's hooks (record_stream
from C++ included), CUDA graphs and cudagraph trees, torch's memory
functions, out of memory, debug mode.  Skipped without CUDA."""
import pytest

from helpers.gpu_helpers import requires_cuda, run_program

pytestmark = requires_cuda
POLICIES = ["lazy_wait", "poll"]


def test_every_hook_reaches_the_shim_record_stream_from_cpp_included():
    r = run_program("dropin_programs.py", "hooks")
    assert {"set_record_stream_fn", "set_reset_fn", "set_memory_fraction_fn", "set_begin_allocate_to_pool",
            "set_end_allocate_to_pool_fn", "set_release_pool", "set_base_alloc_fn", "set_init_fn"} <= set(r["wired"])
    assert r["from_python"] == [r["side"]]
    assert len(r["from_cpp"]) == 1  # gloo's own stream, recorded by C++ (recordDataPtrOnStream)
    assert r["reserved_after_empty_cache"] < r["reserved_before"]
    assert r["fraction"] == 0.5 and r["base_ok"] and r["findings"] == []


@pytest.mark.parametrize("policy", POLICIES)
def test_graph_record_stream(policy):
    r = run_program("dropin_programs.py", "graph_record_stream", policy)
    assert r["ok"] and r["findings"] == [] and r["deferred"] >= 1


@pytest.mark.parametrize("policy", POLICIES)
def test_eager_memory_and_graph_memory_stay_apart(policy):
    r = run_program("dropin_programs.py", "graph_memory_is_not_clobbered", policy)
    assert r["correct"] == [True, True, True]
    assert r["static_out_in_pool"] and not r["eager_in_pool"] and r["findings"] == []


@pytest.mark.parametrize("policy", POLICIES)
def test_make_graphed_callables(policy):
    r = run_program("dropin_programs.py", "graphed_callables", policy)
    assert r["same"] == [True, True, True] and r["findings"] == []


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("mode", ["inference", "train"])
def test_torch_compile_reduce_overhead_matches_eager(policy, mode):
    r = run_program("dropin_programs.py", "reduce_overhead", policy, mode, timeout=600)
    assert r["error"] is None and r["same"] == [True] * 6 and r["findings"] == []


def test_a_cudagraph_tree_pool_restore_is_correct():
    r = run_program("dropin_programs.py", "reduce_overhead", "lazy_wait", "mixed", timeout=600)
    assert all(r["same"]) and r["findings"] == []
    assert r["error"] is None


@pytest.mark.parametrize("policy", POLICIES)
def test_record_stream_oom_waits_for_pending_events(policy):
    r = run_program("dropin_programs.py", "record_stream_oom", policy)
    assert r["failures"] == 0 and r["findings"] == []
    assert r["num_alloc_retries"] > 0


def test_torchs_memory_functions_work_under_the_shim():
    r = run_program("dropin_programs.py", "memory_tools")
    assert r["allocated"] == 3 << 20 and r["peak"] >= 3 << 20 and r["reserved"] >= 3 << 20
    assert r["after_reset"] == 0 and r["keys_present"] and r["summary_lines"] > 20 and r["ours_agree"]


def test_debug_mode_turns_a_missing_handoff_into_nan_every_time():
    r = run_program("dropin_programs.py", "debug_missing_handoff", "debug")
    assert r["seen"] == ["nan"] * 5 and r["poisoned"] >= 5
