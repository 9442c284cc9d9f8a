"""record_use on a real GPU (skipped without one): the native fallback's
allocation-stream no-op, capture, resize_(0), per-call cost and fork; the
fast path under the shim.  Their logic runs on CPU in test_native_fallback.py
and test_record_use.py."""
from gpu_helpers import requires_cuda, run_program

pytestmark = requires_cuda


def test_fallback_is_a_no_op_on_the_allocation_stream():
    r = run_program("record_use_programs.py", "fallback_allocation_stream")
    assert r["held_after_own_streams"] == 0 and r["on_allocation_stream"] == 3
    assert r["held_after_other"] == 1


def test_fallback_under_capture_degrades_and_never_queries_a_captured_event():
    r = run_program("record_use_programs.py", "fallback_capture")
    assert r["error"] is None, r["error"]
    assert r["replayed_ok"] and r["in_capture"] == 1
    assert r["reclaimed_after_capture"] == 1  # the eager entry, once the capture is over


def test_fallback_keeps_the_memory_across_resize_to_zero():
    r = run_program("record_use_programs.py", "fallback_resize")
    assert r["control"] == {"reused": True, "corrupted": True}, r  # without record_use the bug shows
    assert not r["record_use"]["corrupted"] and not r["record_use"]["reused"], r
    assert r["kept_across_resize"] == 1


def test_fallback_work_per_call_is_what_completed_not_what_is_held():
    r = run_program("record_use_programs.py", "fallback_cost", "1000")
    assert r["held"] == 2000 or r["held"] == 0  # all pending (or all done if the GPU was quick)
    assert r["queries"] <= 2 * r["calls"], r  # at most the head of the one stream per call, plus what fired
    print(r)


def test_fallback_forked_children_never_deadlock():
    r = run_program("record_use_programs.py", "fallback_fork", "10")
    assert r["outcomes"] == [0] * 10


def test_fallback_releases_at_the_next_call_once_fired():
    r = run_program("record_use_programs.py", "fallback_reclaimed_at_the_next_call")
    assert r["held_while_pending"] == 1 and r["held_after"] == 1  # x released; the new call's tensor held
    assert r["events_created"] <= 2


def test_shim_record_use_stays_on_the_fast_path():
    r = run_program("record_use_programs.py", "shim_fast_path")
    assert r["slow_calls"] == 0
    assert r["use_event_streams"] == [r["side"]] and r["findings"] == []
