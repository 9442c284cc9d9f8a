"""torch's memory history, one entry for one (issue 37, item 10).

For one ``torch.randn(1 << 20, device="cuda")`` and its ``del`` torch's
allocator records SEGMENT_ALLOC, ALLOC, FREE_REQUESTED, FREE_COMPLETED; the
shim's bridge recorded ALLOC, FREE_REQUESTED, FREE_COMPLETED (all three at
the call, the segment unseen).  The bridge records ALLOC after npl_alloc and
FREE_REQUESTED before npl_free; what only the allocator sees comes from
npl_set_history_hook as it happens.  Here the bridge's two entries are
played by the test around the C calls, on the simulated runtime; the GPU
test (test_gpu_entry_points.py, ``history_sequence``) compares the whole
trace with torch's allocator's."""
import ctypes

import pytest
from conftest import S1, S2

from npu_lifetime.shim.libnpl import library
from helpers.shim_testing import check_invariants

MiB = 1 << 20
HOOK = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int, ctypes.c_void_p,
                        ctypes.c_uint64, ctypes.c_uint64, ctypes.c_void_p)
ACTIONS = ("segment_alloc", "segment_free", "segment_map", "segment_unmap", "free_completed")  # enum npl_history_action


class Bridge:
    """The CUDA bridge's part of the history around the shim's calls."""

    def __init__(self, shim):
        self.shim, self.entries = shim, []
        self._hook = HOOK(self._on_shim_action)  # kept alive while set
        library().npl_set_history_hook(ctypes.cast(self._hook, ctypes.c_void_p), None)

    def _on_shim_action(self, action, ptr, size, device, stream, id0, id1, _ctx):
        self.entries.append((ACTIONS[action], ptr or 0, size))

    def alloc(self, size, stream=S1):
        p = self.shim.alloc(size, 0, stream)
        self.entries.append(("alloc", p, size) if p else ("oom", 0, size))
        return p

    def free(self, p, size, stream=S1):
        self.entries.append(("free_requested", p, size))
        self.shim.free(p, size, 0, stream)

    def actions(self):
        return [a for a, _, _ in self.entries]


@pytest.fixture
def bridge(sim_shim):
    b = Bridge(sim_shim)
    yield b
    library().npl_set_history_hook(None, None)


def test_an_allocation_with_a_new_segment_and_its_free_are_torchs_four_entries(bridge, sim_shim):
    p = bridge.alloc(4 * MiB)
    bridge.free(p, 4 * MiB)
    # before: alloc, free_requested, free_completed (the segment unseen)
    assert bridge.actions() == ["segment_alloc", "alloc", "free_requested", "free_completed"]
    segment = sim_shim.base_allocation(p)
    assert bridge.entries[0] == ("segment_alloc", segment[0], segment[1])
    assert bridge.entries[3] == ("free_completed", p, 4 * MiB)  # torch's: the requested size
    sim_shim.empty_cache()
    assert bridge.entries[4:] == [("segment_free", segment[0], segment[1])]
    check_invariants()


def test_a_free_completes_once_its_events_fired(bridge, sim_shim):
    p = bridge.alloc(4096)
    sim_shim.record_stream(p, S2)
    sim_shim.sim.launch(S2)  # S2 reads p
    bridge.free(p, 4096)
    assert bridge.actions() == ["segment_alloc", "alloc", "free_requested"]  # before: free_completed at once
    sim_shim.process_events()
    assert bridge.actions()[-1] == "free_requested"  # S2 still reads
    sim_shim.sim.complete(S2)
    sim_shim.process_events()
    assert bridge.entries[-1] == ("free_completed", p, 4096)


def test_the_out_of_memory_path_gives_cached_segments_back_before_the_oom(bridge, sim_shim):
    sim_shim.sim.set_memory_limit(64 * MiB)
    p = bridge.alloc(30 * MiB)
    bridge.free(p, 30 * MiB)  # cached
    assert bridge.alloc(100 * MiB) == 0
    assert bridge.actions() == ["segment_alloc", "alloc", "free_requested", "free_completed", "segment_free", "oom"]


def test_expandable_segments_map_and_unmap_as_torchs(bridge, sim_shim):
    sim_shim.set_expandable_segments(True)
    try:
        p = bridge.alloc(4 * MiB)
        q = bridge.alloc(30 * MiB)  # more pages at the segment's end
        bridge.free(q, 30 * MiB)
        bridge.free(p, 4 * MiB)
        sim_shim.empty_cache()
    finally:
        sim_shim.set_expandable_segments(False)
    actions = bridge.actions()
    assert "segment_alloc" not in actions and "segment_free" not in actions  # torch: every mapping is a map
    assert actions[:2] == ["segment_map", "alloc"] and actions[-1] == "segment_unmap"
    mapped = sum(size for a, _, size in bridge.entries if a == "segment_map")
    unmapped = sum(size for a, _, size in bridge.entries if a == "segment_unmap")
    assert mapped == unmapped >= 34 * MiB
    check_invariants()


def test_no_hook_no_calls(sim_shim):
    seen = []
    hook = HOOK(lambda *args: seen.append(args))
    library().npl_set_history_hook(ctypes.cast(hook, ctypes.c_void_p), None)
    library().npl_set_history_hook(None, None)
    sim_shim.free(sim_shim.alloc(4096, 0, S1), 4096, 0, S1)
    assert seen == []
