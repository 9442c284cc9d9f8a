"""The shim's ACL runtime table, against a stand-in libascendcl.so that
implements the published AscendCL signatures and status codes over host
memory (allocator_shim/tests/fake_ascendcl.c).  No NPU is involved."""
from npu_lifetime import shim

STREAM, OTHER = 0x5000, 0x6000


def test_allocations_go_through_aclrtMalloc(acl_shim):
    assert shim.runtime_name() == "acl"
    p = shim.alloc(1000, 0, STREAM)
    assert p != 0
    assert acl_shim.fake_acl_calls(b"aclrtMalloc") == 1
    assert acl_shim.fake_acl_last_policy() == 0  # ACL_MEM_MALLOC_HUGE_FIRST
    shim.free(p, 1000, 0, STREAM)
    shim.empty_cache()
    assert acl_shim.fake_acl_calls(b"aclrtFree") == 1 and acl_shim.fake_acl_in_use() == 0


def test_the_default_null_stream_works(acl_shim):
    p = shim.alloc(64, 0, 0)
    shim.record_use(p, STREAM)
    shim.free(p, 64, 0, 0)
    assert shim.findings() == [] and shim.stats()["pending.all.current"] == 1


def test_record_use_waits_for_aclrtQueryEventStatus_complete(acl_shim):
    p = shim.alloc(4096, 0, STREAM)
    shim.record_use(p, OTHER)
    shim.free(p, 4096, 0, STREAM)
    assert shim.alloc(4096, 0, STREAM) != p
    assert acl_shim.fake_acl_calls(b"aclrtQueryEventStatus") >= 1
    acl_shim.fake_acl_complete(OTHER)
    assert shim.alloc(4096, 0, STREAM) == p


def test_record_stream_records_at_the_free(acl_shim):
    p = shim.alloc(4096, 0, STREAM)
    shim.record_stream(p, OTHER)
    records = acl_shim.fake_acl_calls(b"aclrtRecordEvent")
    shim.free(p, 4096, 0, STREAM)
    assert acl_shim.fake_acl_calls(b"aclrtRecordEvent") == records + 1
    acl_shim.fake_acl_complete(OTHER)
    shim.process_events()
    assert shim.stats()["pending.all.current"] == 0


def test_stream_wait_policy_uses_aclrtStreamWaitEvent(acl_shim):
    shim.set_policy("stream_wait")
    p = shim.alloc(4096, 0, STREAM)
    shim.record_use(p, OTHER)
    shim.free(p, 4096, 0, STREAM)
    assert shim.alloc(4096, 0, STREAM) == p
    assert acl_shim.fake_acl_calls(b"aclrtStreamWaitEvent") == 1


def test_capture_status_from_aclmdlRICaptureGetInfo(acl_shim):
    p = shim.alloc(4096, 0, STREAM)
    shim.record_use(p, OTHER)
    shim.free(p, 4096, 0, STREAM)
    acl_shim.fake_acl_complete(OTHER)
    acl_shim.fake_acl_set_capturing(STREAM, 1)
    queries = acl_shim.fake_acl_calls(b"aclrtQueryEventStatus")
    assert shim.alloc(4096, 0, STREAM) != p
    assert acl_shim.fake_acl_calls(b"aclrtQueryEventStatus") == queries  # no polling
    assert acl_shim.fake_acl_calls(b"aclmdlRICaptureGetInfo") >= 1
    acl_shim.fake_acl_set_capturing(STREAM, 0)
    assert shim.alloc(4096, 0, STREAM) == p


def test_acl_out_of_memory_code_is_recognised(acl_shim):
    acl_shim.fake_acl_set_memory_limit(1 << 20)
    try:
        assert shim.alloc(4096, 0, STREAM) == 0
    finally:
        acl_shim.fake_acl_set_memory_limit(0)
    [f] = shim.findings()
    assert (f["kind"], f["code"]) == ("out_of_memory", 207001)
    assert shim.stats()["num_alloc_retries"] == 1


def test_unrecorded_use_on_acl(acl_shim):
    p = shim.alloc(4096, 0, STREAM)
    shim.note_use(p, OTHER)
    shim.free(p, 4096, 0, STREAM)
    assert [f["kind"] for f in shim.findings()] == ["unrecorded_use"]


def test_the_runtime_cannot_change_while_memory_is_held(acl_shim):
    import pytest

    from npu_lifetime.shim import ShimError

    p = shim.alloc(64, 0, STREAM)
    with pytest.raises(ShimError, match="while the allocator holds memory"):
        shim.select_runtime("sim")
    shim.free(p, 64, 0, STREAM)


def test_events_follow_canns_documented_protocol(acl_shim):
    """(issue 37) The plain ACL runtime made its events with aclrtCreateEvent
    and re-recorded them while a record (and a wait on it) could still be
    pending; CANN documents "a wait keeps the record it saw" only for
    aclrtCreateEventExWithFlag events (record -> wait -> reset for plain
    ones).  Under stream_wait a block is handed out behind a wait on its
    pending event, whose event then goes back to the idle events."""
    shim.set_policy("stream_wait")
    for _ in range(4):
        p = shim.alloc(4096, 0, STREAM)
        shim.record_use(p, OTHER)
        acl_shim.fake_acl_launch(OTHER)  # OTHER still works on p: its events stay pending
        shim.free(p, 4096, 0, STREAM)
    assert shim.findings() == []
    assert acl_shim.fake_acl_calls(b"aclrtRecordEvent") >= 4
    # before: 3 re-records of a pending plain event, no ExWithFlag event
    assert acl_shim.fake_acl_calls(b"plain event re-recorded while pending") == 0
    assert acl_shim.fake_acl_calls(b"aclrtCreateEventExWithFlag") >= 1
