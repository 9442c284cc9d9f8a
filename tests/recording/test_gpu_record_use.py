"""record_use on a real GPU (skipped without one): the torch-allocator fallback's
allocation-stream no-op, capture, resize_(0), per-call cost and fork; the
fast path under the shim.  Their logic runs on CPU in test_torch_allocator_fallback.py
and test_record_use.py."""
from helpers.gpu_helpers import requires_cuda, run_program

pytestmark = requires_cuda


def test_fallback_is_a_no_op_on_the_allocation_stream():
    r = run_program("record_use_programs.py", "fallback_allocation_stream")
    assert r["held_after_own_streams"] == 0 and r["on_allocation_stream"] == 3
    assert r["held_after_other"] == 1


def test_fallback_under_capture_degrades_and_never_queries_a_captured_event():
    r = run_program("record_use_programs.py", "fallback_capture")
    assert r["error"] is None, r["error"]  # a query during the capture would have invalidated it
    assert r["replayed_ok"] and r["in_capture"] == 1
    assert r["released_after_capture"], r  # the eager entry, once the capture is over, without a call


def test_fallback_keeps_the_memory_across_resize_to_zero():
    r = run_program("record_use_programs.py", "fallback_resize")
    assert r["control"] == {"reused": True, "corrupted": True}, r  # without record_use the bug shows
    assert not r["record_use"]["corrupted"] and not r["record_use"]["reused"], r
    assert r["kept_across_resize"] == 1


def test_fallback_work_per_call_is_what_completed_not_what_is_held():
    r = run_program("record_use_programs.py", "fallback_cost", "1000")
    assert r["held"] <= 2000  # pending (the reaper releases what the GPU finished)
    assert r["queries"] <= 2 * r["calls"], r  # a call queries nothing; polls query heads and what fired
    print(r)


def test_fallback_forked_children_never_deadlock():
    r = run_program("record_use_programs.py", "fallback_fork", "10")
    assert r["outcomes"] == [0] * 10


def test_fallback_releases_once_fired_without_another_call():
    r = run_program("record_use_programs.py", "fallback_released_without_another_call")
    assert r["held_while_pending"] == 1 and r["held_while_sleeping"] == 1, r
    assert r["released"] and r["released_in_background"] >= 1, r  # the reaper, no record_use call
    assert r["events_created"] == 1


def test_fallback_out_of_memory_observer_releases_what_fired():
    r = run_program("record_use_programs.py", "fallback_out_of_memory_observer")
    assert r["held_before"] == 1 and r["oom"] and r["held_after"] == 0, r
    assert r["out_of_memory_polls"] >= 1 and r["allocated_after"], r


def test_fallback_records_raw_cuda_events_and_leaves_no_error_for_torch():
    r = run_program("record_use_programs.py", "fallback_raw_events")
    assert r["raw_events"], "the table did not find torch's CUDA runtime: it fell back to torch.cuda.Event"
    assert r["released_while_busy"] == 0 and r["error"] is None, r  # a not-ready query's status was cleared
    assert r["released"] and r["held_on_default"] == 1 and r["released_default"], r
    assert r["events_created"] >= 1 and r["recorded"] == 2, r


def test_shim_record_use_stays_on_the_fast_path():
    r = run_program("record_use_programs.py", "shim_fast_path")
    assert r["slow_calls"] == 0
    assert r["use_event_streams"] == [r["side"]] and r["findings"] == []
