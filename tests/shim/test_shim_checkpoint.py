"""Graph pool checkpoints as torch's PrivatePoolState keeps them (issue 37,
item 5): every block at its real (rounded) size, so a restore gives back the
same layout and statistics, and torch's checks before a checkpoint is taken
or restored (the frees a capture deferred done first; the pool known and not
released).  On the simulated runtime, through the Python entry points
``install("cuda")`` routes torch's to (shim/torch_api.py) and the C ABI the
CUDA bridge calls (npl_prepare_pool_checkpoint, npl_claim_next)."""
import pytest
from conftest import S1, S2

from npu_lifetime.shim import torch_api
from npu_lifetime.shim.libnpl import library
from helpers.shim_testing import check_invariants

KiB = 1 << 10
MiB = 1 << 20
POOL = (7, 0)


def _pool_layout(shim):
    return [(b["address"], b["size"], b["state"]) for seg in shim.snapshot()["segments"]
            if tuple(seg["graph_pool"]) == POOL for b in seg["blocks"]]


def _allocated(shim):
    return shim.stats(0)["allocated_bytes.all.current"]


def _restore(shim, checkpoint):
    """What setCheckpointPoolState does through the C ABI: the pool's live
    blocks freed, each checkpointed block claimed back at its size."""
    sizes = {b["address"]: b["requested"] for seg in shim.snapshot()["segments"] for b in seg["blocks"]}
    for ptr in shim.pool_live_allocations(0, POOL):
        shim.free(ptr, sizes[ptr], 0, S1)
    for ptr, (size, stream) in sorted(checkpoint.live.items()):
        library().npl_claim_next(ptr)
        assert shim.alloc(size, 0, stream) == ptr, shim.findings()


def _fill_a_pool_with_an_unsplit_block(shim):
    """A 20 MiB pool segment: twice 7.5 MiB, then 4608 KiB in the 5120 KiB
    left (its 512 KiB rest is too small to split off a large block)."""
    shim.begin_allocate_to_pool(0, POOL, S1)
    first, second = shim.alloc(7680 * KiB, 0, S1), shim.alloc(7680 * KiB, 0, S1)
    small = shim.alloc(4608 * KiB, 0, S1)
    shim.end_allocate_to_pool(0, POOL)
    return first, second, small


def test_a_restored_checkpoint_keeps_every_block_at_its_size(sim_shim):
    first, second, small = _fill_a_pool_with_an_unsplit_block(sim_shim)
    layout, allocated = _pool_layout(sim_shim), _allocated(sim_shim)
    assert (small, 5120 * KiB, "live") in layout and allocated == 20 * MiB
    checkpoint = torch_api.get_checkpoint_state(0, POOL)
    assert checkpoint.live == {first: (7680 * KiB, S1), second: (7680 * KiB, S1), small: (5120 * KiB, S1)}
    _restore(sim_shim, checkpoint)
    # before: the 5120 KiB block came back as 4608 KiB plus a free 512 KiB
    # block, and allocated_bytes went from 20971520 to 20447232
    assert _pool_layout(sim_shim) == layout
    assert _allocated(sim_shim) == allocated
    assert sim_shim.findings() == []
    check_invariants()


def test_a_released_pool_is_not_checkpointed(sim_shim):
    _fill_a_pool_with_an_unsplit_block(sim_shim)
    checkpoint = torch_api.get_checkpoint_state(0, POOL)
    sim_shim.release_pool(0, POOL)  # freeable: its blocks are still live
    # before: an empty or stale checkpoint, silently
    with pytest.raises(RuntimeError, match="Not expected to checkpoint freeable graph"):
        torch_api.get_checkpoint_state(0, POOL)
    with pytest.raises(RuntimeError, match="Not expected to checkpoint freeable graph"):
        torch_api.set_checkpoint_pool_state(0, checkpoint, [], [])


def test_a_pool_never_opened_is_not_checkpointed(sim_shim):
    with pytest.raises(RuntimeError, match="Could not find pool of id"):
        torch_api.get_checkpoint_state(0, (99, 0))
    assert library().npl_prepare_pool_checkpoint(0, 99, 0) == 2
    sim_shim.begin_allocate_to_pool(0, POOL, S1)
    sim_shim.end_allocate_to_pool(0, POOL)
    assert library().npl_prepare_pool_checkpoint(0, POOL[0], POOL[1]) == 0


def test_a_checkpoint_runs_the_frees_a_capture_deferred_first(sim_shim):
    sim_shim.begin_allocate_to_pool(0, POOL, S1)
    sim_shim.sim.set_capturing(S1, True)
    p = sim_shim.alloc(4096, 0, S1)
    sim_shim.record_stream(p, S2)
    sim_shim.free(p, 4096, 0, S1)  # during the capture: its event can't be recorded yet
    sim_shim.sim.set_capturing(S1, False)
    sim_shim.end_allocate_to_pool(0, POOL)
    assert [s for a, _, s in _pool_layout(sim_shim) if a == p] == ["deferred"]
    torch_api.get_checkpoint_state(0, POOL)
    # before: still deferred, as torch's getCheckpointState never leaves it
    assert [s for a, _, s in _pool_layout(sim_shim) if a == p] != ["deferred"]
    check_invariants()
