"""Every free is validated; problems are structured findings, never a crash."""
import pytest

from conftest import S1, S2

from helpers.shim_testing import pending_once_done


def kinds(shim):
    return [f["kind"] for f in shim.findings()]


def test_unknown_pointer(sim_shim):
    sim_shim.free(0xDEAD0, 64, 0, S1)
    [f] = sim_shim.findings()
    assert (f["kind"], f["op"], f["address"], f["size"]) == ("unknown_pointer", "free", 0xDEAD0, 64)


def test_double_free(sim_shim):
    p = sim_shim.alloc(64, 0, S1)
    sim_shim.free(p, 64, 0, S1)
    sim_shim.free(p, 64, 0, S1)
    assert kinds(sim_shim) == ["double_free"]
    assert sim_shim.stats()["allocation.all.freed"] == 1


def test_size_mismatch_is_reported_and_the_live_owner_keeps_its_block(sim_shim):
    """(issue 37) A free of another size than the live owner's never frees
    that owner: the block stays allocated, and is not handed out again."""
    p = sim_shim.alloc(64, 0, S1)
    sim_shim.free(p, 65, 0, S1)
    [f] = sim_shim.findings()
    assert (f["kind"], f["size"], f["expected_size"]) == ("size_mismatch", 65, 64)
    assert "not freed" in f["detail"]
    assert sim_shim.stats()["allocation.all.current"] == 1
    assert sim_shim.alloc(64, 0, S1) != p  # not a second owner
    sim_shim.free(p, 64, 0, S1)  # the owner's own free still works
    assert sim_shim.stats()["allocation.all.current"] == 1


def test_a_stale_free_with_an_earlier_owners_size_never_frees_a_live_owner_carved_there(sim_shim):
    """(issue 37) The earlier owner's free, replayed once the address has a
    live owner of another size (here carved from the same cached block), is
    refused: the book still remembers that owner here, so it reads as a
    double free; once the book forgot it (2^20 later frees) it reads as a
    size mismatch, the branch the test above drives, and is refused too."""
    p = sim_shim.alloc(4096, 0, S1)
    sim_shim.free(p, 4096, 0, S1)
    owner = sim_shim.alloc(2048, 0, S1)
    assert owner == p
    sim_shim.free(p, 4096, 0, S1)
    assert kinds(sim_shim)[-1] in ("double_free", "size_mismatch")
    assert sim_shim.stats()["allocation.all.current"] == 1
    assert sim_shim.alloc(2048, 0, S1) != owner


def test_unrecorded_use_noted_by_the_sanitizer(sim_shim):
    p = sim_shim.alloc(4096, 0, S1)
    sim_shim.note_use(p, S2)
    sim_shim.free(p, 4096, 0, S1)
    [f] = sim_shim.findings()
    assert (f["kind"], f["stream"], f["alloc_stream"]) == ("unrecorded_use", S2, S1)
    assert sim_shim.stats()["pending.all.current"] == 1  # and the block stays safe
    assert pending_once_done(sim_shim, S2) == 0


def test_noted_use_that_already_finished_is_no_finding(sim_shim):
    p = sim_shim.alloc(4096, 0, S1)
    sim_shim.note_use(p, S2)
    sim_shim.sim.complete(S2)
    sim_shim.free(p, 4096, 0, S1)
    assert kinds(sim_shim) == [] and sim_shim.stats()["pending.all.current"] == 0


@pytest.mark.parametrize("cover", ["record_use", "record_stream"])
def test_noted_use_covered_by_a_later_call_is_no_finding(sim_shim, cover):
    p = sim_shim.alloc(4096, 0, S1)
    sim_shim.note_use(p, S2)
    getattr(sim_shim, cover)(p, S2)
    sim_shim.free(p, 4096, 0, S1)
    assert kinds(sim_shim) == [] and sim_shim.stats()["pending.all.current"] == 1


def test_record_use_before_a_noted_use_does_not_cover_it(sim_shim):
    p = sim_shim.alloc(4096, 0, S1)
    sim_shim.record_use(p, S2)
    sim_shim.note_use(p, S2)
    sim_shim.free(p, 4096, 0, S1)
    assert kinds(sim_shim) == ["unrecorded_use"]


@pytest.mark.parametrize("call", ["record_use", "record_stream", "erase_stream", "note_use"])
def test_lifetime_calls_on_freed_or_unknown_pointers(sim_shim, call):
    p = sim_shim.alloc(64, 0, S1)
    sim_shim.free(p, 64, 0, S1)
    assert not getattr(sim_shim, call)(p, S2)
    assert not getattr(sim_shim, call)(0xBAD00, S2)
    assert kinds(sim_shim) == ["use_after_free", "unknown_pointer"]


def test_negative_size_and_null_pointers_do_not_crash(sim_shim):
    # the C entry points torch calls (the Python wrappers refuse -1 first: tests/cli/test_bad_inputs.py)
    from npu_lifetime.shim.libnpl import library

    assert (library().npl_alloc(-1, 0, S1) or 0) == 0
    sim_shim.free(0, 10, 0, S1)
    assert not sim_shim.record_use(0, S2)
    assert kinds(sim_shim) == ["invalid_size", "unknown_pointer"]


def test_findings_count_in_stats(sim_shim):
    sim_shim.free(0x10, 1, 0, S1)
    sim_shim.free(0x20, 1, 0, S1)
    assert sim_shim.stats()["findings"] == 2


def test_runtime_selection_errors(sim_shim):
    from npu_lifetime.shim import ShimError

    with pytest.raises(ShimError, match="unknown runtime 'tpu'"):
        sim_shim.select_runtime("tpu")
    with pytest.raises(ValueError, match="unknown policy"):
        sim_shim.set_policy("eventually")


def test_a_stale_double_free_after_a_new_owner_does_not_free_the_new_block(sim_shim):
    p = sim_shim.alloc(1000, 0, S1)
    sim_shim.free(p, 1000, 0, S1)
    q = sim_shim.alloc(2000, 0, S1)
    assert q == p  # the address went to a new owner
    sim_shim.free(p, 1000, 0, S1)  # the first owner frees again
    [f] = sim_shim.findings()
    assert (f["kind"], f["address"], f["generation"]) == ("double_free", p, 2)
    assert "new owner" in f["detail"]
    assert sim_shim.stats()["allocation.all.current"] == 1  # q is still live
    r = sim_shim.alloc(2000, 0, S1)
    assert r != q  # and never handed out twice
    sim_shim.free(q, 2000, 0, S1)
    assert sim_shim.findings() == []


def test_a_double_free_after_a_merge_is_a_double_free(sim_shim):
    p = sim_shim.alloc(1000, 0, S1)
    r = sim_shim.alloc(1000, 0, S1)
    sim_shim.free(r, 1000, 0, S1)
    sim_shim.free(p, 1000, 0, S1)  # p and r merge into one cached block at p
    sim_shim.free(r, 1000, 0, S1)
    [f] = sim_shim.findings()
    assert f["kind"] == "double_free" and f["address"] == r


def test_a_free_of_an_interior_address_frees_nothing(sim_shim):
    p = sim_shim.alloc(4096, 0, S1)
    sim_shim.free(p + 512, 4096, 0, S1)
    [f] = sim_shim.findings()
    assert f["kind"] == "interior_pointer"
    assert sim_shim.stats()["allocation.all.current"] == 1


def test_a_free_with_another_stream_is_reported(sim_shim):
    p = sim_shim.alloc(64, 0, S1)
    sim_shim.free(p, 64, 0, S2)
    [f] = sim_shim.findings()
    assert (f["kind"], f["stream"], f["alloc_stream"]) == ("stream_mismatch", S2, S1)


def test_lifetime_calls_accept_a_view_address(sim_shim):
    p = sim_shim.alloc(4096, 0, S1)
    assert sim_shim.record_use(p + 1024, S2)
    assert sim_shim.record_stream(p + 4000, S2)
    sim_shim.free(p, 4096, 0, S1)
    assert sim_shim.findings() == []
    assert sim_shim.stats()["pending.all.current"] == 1


def test_the_runtime_says_how_many_devices_it_sees(sim_shim):
    assert sim_shim.device_count() == 8  # the simulated runtime's



@pytest.mark.parametrize("bad_free", ["unknown", "double", "size"])
def test_the_free_hook_hears_only_of_frees_that_free_a_block(sim_shim, bad_free):
    """(issue 37) The hook (the sanitizer's feed) fired before the free was
    validated, so a refused free still reached the sanitizer as a free."""
    from npu_lifetime.shim import hooks

    heard = []
    sub = hooks.subscribe(None, lambda ptr, size, device, stream: heard.append((ptr, size)))
    try:
        p = sim_shim.alloc(64, 0, S1)
        if bad_free == "unknown":
            sim_shim.free(0xDEAD0, 64, 0, S1)
        elif bad_free == "double":
            sim_shim.free(p, 64, 0, S1)
            heard.clear()
            sim_shim.free(p, 64, 0, S1)
        else:
            sim_shim.free(p, 65, 0, S1)
        assert heard == [], heard
        assert sim_shim.findings()  # each refused free is a finding instead
        q = sim_shim.alloc(128, 0, S1)
        sim_shim.free(q, 128, 0, S1)  # a valid free is heard
        assert heard == [(q, 128)]
    finally:
        hooks.unsubscribe(sub)
