"""The shim installed into the real torch_npu (install('npu')), over the
stand-in CANN runtime, each program in a fresh torch_npu process, with
torch_npu's task queue at its default unless a test says otherwise.
Nothing here runs on NPU hardware."""
import pytest

from helpers.npu_helpers import TASK_QUEUE_LEVELS, program_result, requires_standin, run_npu_program, task_queue_env


def run(program, *args, env=None):
    return program_result(run_npu_program("shim_programs.py", program, *args, env=env))


@pytest.mark.parametrize("level", TASK_QUEUE_LEVELS)
def test_install_works_at_every_task_queue_level(level):
    r = run("basics", env=task_queue_env(level))
    assert r["runtime"] == "acl" and r["values_ok"] and r["findings"] == []
    assert {"set_record_stream_fn", "set_erase_stream_fn", "set_get_device_stats_fn"} <= set(r["hooks"])
    assert r["recorded"] == [r["side"]]  # record_stream reached the shim, the NPUStream decoded to its aclrtStream
    assert r["reserved_after"] < r["reserved_before_empty_cache"]  # empty_cache reached it


@requires_standin
@pytest.mark.parametrize("level", ["1", "2"])
@pytest.mark.parametrize("policy", ["poll", "lazy_wait"])
def test_the_shims_events_follow_the_work_queued_before_them(level, policy):
    # torch_npu's launch thread is held, so the side stream's kernel is still
    # in the task queue when record_use records the shim's event.
    r = run("ordering", policy, env=task_queue_env(level))
    assert r["y_ok"] and r["z_ok"] and r["findings"] == []
    if policy == "poll":
        assert r["pending_after_free"] == 1 and not r["reused"]  # the event waits behind the kernel
    else:
        assert r["reused"] and r["waited"]  # handed out at once, behind a wait on that event


@requires_standin
@pytest.mark.parametrize("level", ["1", "2"])
def test_without_the_queue_operations_the_event_overtakes_the_queued_kernel(level):
    # The failure the NPU bridge's queue operations remove: recorded straight
    # through ACL, the event completes at once, the block is reused, and the
    # kernel, launched later, reads the next owner's data.
    r = run("ordering", "poll", "direct", env=task_queue_env(level))
    assert r["pending_after_free"] == 0 and r["reused"] and not r["y_ok"]


def test_torch_npu_memory_functions_return_the_shims_figures():
    r = run("memory_functions")
    assert r["got"] == r["want"]
    assert r["peak_after_reset"] == 1 << 20  # only x is left after the reset
    assert r["snapshot_segments"] >= 1 and r["summary_has_title"] and r["fraction"] == 0.5


@requires_standin  # the stand-in's memory cap
def test_out_of_memory_raises_torchs_error_and_the_program_goes_on():
    r = run("out_of_memory", "64", env={"NPU_STANDIN_MEMORY_BYTES": str(32 << 20)})
    assert r["error"] and "out of memory" in r["error"].lower()
    assert r["goes_on"] and r["num_ooms"] >= 1


def test_record_use_under_the_shim_puts_one_use_event_on_the_block():
    r = run("record_use_shim")
    assert r["events"] == [{"stream": r["side"], "kind": "record_use"}]
    assert r["y_ok"] and r["pending"] == 0 and r["findings"] == []


@requires_standin  # holds the side stream
def test_record_use_over_torch_npus_own_allocator_holds_then_releases_without_another_call():
    r = run("record_use_fallback")
    assert r["held_while_paused"] == 1 and r["held_after"] == 0 and r["y_ok"]


def test_record_use_over_torch_npus_own_allocator_refuses_misuse_with_what_to_pass():
    r = run("record_use_fallback_misuse")
    errors = r["errors"]
    assert errors["stream str"].startswith("RecordUseError") and "needs a stream" in errors["stream str"], errors
    assert errors["stream int"].startswith("RecordUseError") and "needs a stream" in errors["stream int"], errors
    assert "simdevice stream goes with CPU tensors" in errors["stream simdevice"], errors
    assert "needs a tensor" in errors["tensor list"], errors
    assert "freed storage" in errors["freed storage"], errors
    assert r["held_after_misuse"] == 0
    assert r["checked_calls"] == 0 and r["held_after_call"] == 1  # a proper call stays on the fast path


@requires_standin
def test_expandable_segments_from_the_npu_alloc_conf():
    """PYTORCH_NPU_ALLOC_CONF=expandable_segments:True, as torch_npu users set
    it, over the stand-in's virtual memory (aclrtReserveMemAddress, ...)."""
    r = run("expandable", env={"PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True"})
    assert r["expandable_setting"] and r["findings"] == [], r
    assert r["large_segments"] == r["large_expandable"] == 1 and r["in_place"] and r["values_ok"], r
    assert r["reserved_after"] < r["reserved_before"]


@requires_standin
def test_the_bridges_fallbacks_for_a_foreign_stream_synchronise_its_device():
    """(issue 37) For a stream torch_npu does not manage, event_record,
    stream_synchronize and stream_drain synchronised the current device (0),
    not the stream's (1): the stream's work was still running after them."""
    r = run("foreign_stream_device", env={"NPU_STANDIN_DEVICES": "2"})
    assert r["codes"] == {op: 0 for op in r["done"]}
    assert r["done"] == {"event_record": True, "stream_synchronize": True, "stream_drain": True,
                         "stream_synchronize_never_met": True}
    assert r["current_device"] == 0 and r["acl_current_device"] == 0  # set back after each
    assert r["findings"] == []


@pytest.mark.parametrize("mode", ["off", "idle", "always"])
def test_cross_stream_reuse_through_the_npu_bridge(mode):
    """(issue 39) always: the second stream takes the first one's free
    segment behind a wait through torch_npu's queue; idle: ACL cannot say
    whether a stream is idle behind the task queue, so nothing moves (only
    the out-of-memory path would take it, with the wait); off: torch's
    per-stream caching."""
    r = run("cross_stream", env={"NPU_LIFETIME_CROSS_STREAM_REUSE": mode})
    assert r["mode"] == mode and r["y_ok"] and r["findings"] == []
    moved = mode == "always"
    assert r["same_address"] == moved and r["cross_stream_segments"] == int(moved)
    if moved:
        assert r["stream_waits"] >= 1
