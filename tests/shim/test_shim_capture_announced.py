"""Captures announced (issue 37, item 11; design D19): where every capture
opens a pool first (torch's CUDA graphs; install("cuda") says so), an
allocation with blocks pending polls their events without asking the
runtime whether its stream is capturing; the pool it opens is what keeps a
capture from being polled.  Unannounced (the default: the ACL route, a
direct C caller) the shim still asks on every allocation while blocks are
pending (test_shim_caching.py's test_no_polling_while_the_allocating_stream_captures,
test_shim_acl.py's test_capture_status_from_aclmdlRICaptureGetInfo)."""
import importlib

import pytest

from conftest import S1, S2
from helpers.shim_testing import check_invariants, sim_calls

POOL = (7, 1)
ALLOCATIONS = 50


@pytest.fixture
def pending(sim_shim):
    """A block freed on S1 whose use on S2 has not run: pending."""
    p = sim_shim.alloc(4096, 0, S1)
    sim_shim.record_use(p, S2)
    sim_shim.free(p, 4096, 0, S1)
    assert sim_shim.stats()["pending.all.current"] == 1
    return p


def allocate_while_pending(shim):
    """ALLOCATIONS allocations of another size class on S1, freed at once."""
    for _ in range(ALLOCATIONS):
        q = shim.alloc(1 << 20, 0, S1)
        shim.free(q, 1 << 20, 0, S1)


@pytest.mark.parametrize("announced", [True, False])
def test_capture_status_is_asked_only_where_captures_are_not_announced(sim_shim, pending, announced):
    """Before: one stream_capturing call per allocation while any block was
    pending, whatever the caller (the unannounced count below)."""
    sim_shim.set_captures_announced(announced)
    asked, polled = sim_calls("stream_capturing"), sim_calls("event_query")
    allocate_while_pending(sim_shim)
    asked = sim_calls("stream_capturing") - asked
    assert asked == (0 if announced else ALLOCATIONS)
    assert sim_calls("event_query") - polled >= ALLOCATIONS  # each allocation still polls the pending block
    sim_shim.sim.complete(S2)
    assert sim_shim.alloc(4096, 0, S1) == pending  # and finds it reusable once its use ran
    check_invariants()


def test_an_announced_capture_is_not_polled(sim_shim, pending):
    """The announced counterpart of test_no_polling_while_the_allocating_stream_captures:
    the pool torch opens before the capture keeps its allocations from
    querying events, with no capture-status call."""
    sim_shim.set_captures_announced(True)
    sim_shim.sim.complete(S2)
    sim_shim.create_or_incref_pool(0, POOL)
    sim_shim.begin_allocate_to_pool(0, POOL, S1)
    sim_shim.sim.set_capturing(S1, True)
    asked, polled = sim_calls("stream_capturing"), sim_calls("event_query")
    inside = sim_shim.alloc(4096, 0, S1)
    assert inside not in (0, pending)
    assert sim_calls("event_query") == polled and sim_calls("stream_capturing") == asked
    assert sim_shim.stats()["pending.all.current"] == 1
    sim_shim.sim.set_capturing(S1, False)
    sim_shim.end_allocate_to_pool(0, POOL)
    assert sim_shim.alloc(4096, 0, S1) == pending  # the capture over: polled again
    sim_shim.free(inside, 4096, 0, S1)
    sim_shim.release_pool(0, POOL)
    check_invariants()


def test_announced_is_off_by_default_and_after_a_reset(sim_shim):
    assert sim_shim.captures_announced() is False
    sim_shim.set_captures_announced(True)
    assert sim_shim.captures_announced() is True
    sim_shim.reset()
    assert sim_shim.captures_announced() is False
    with pytest.raises(TypeError):
        sim_shim.set_captures_announced(1)


def test_install_announces_captures_only_where_torch_opens_a_pool_for_each():
    install = importlib.import_module("npu_lifetime.shim.install")  # the module, whatever the package exports

    cuda_setters = tuple(install._DEVICES["cuda"][1])
    assert install.captures_announced("cuda", cuda_setters + install.CUDA_BRIDGE_ENTRIES)  # the CUDA bridge
    assert install.captures_announced("cuda", cuda_setters)  # the plain pluggable allocator
    # NPU_LIFETIME_HOOKS left the capture's end unwired: an allocation asks the runtime again
    assert not install.captures_announced("cuda", tuple(s for s in cuda_setters if s != "set_end_allocate_to_pool_fn"))
    assert not install.captures_announced("npu", tuple(install._DEVICES["npu"][1]))  # torch_npu's not wired
