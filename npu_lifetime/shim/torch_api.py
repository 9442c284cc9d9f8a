"""torch's allocator entry points that a pluggable allocator cannot serve
through hooks, answered from the shim.

Under ``CUDAPluggableAllocator`` torch 2.11 raises "pluggable does not yet
support ..." for its memory statistics, snapshot, memory fraction query,
and for the pool checks cudagraph trees (``torch.compile(mode=
"reduce-overhead")``) make.  ``install("cuda")`` replaces these
``torch._C`` functions (looked up by torch at each call) with the versions
below; each keeps torch's signature and meaning.

Pool checkpoints.  cudagraph trees checkpoint a pool after each recording
and restore it when a new recording or warm-up follows graphs that
executed: the outputs of executed graphs are storages that do not own their
memory, so the allocator must hold their blocks again.  A checkpoint here
is the pool's live blocks (address, size, stream).  Restoring re-allocates,
through torch's own allocator entry (so torch can free them again), each
block live at the checkpoint and free now; the trees then free the ones
whose outputs died.  torch's native restore also rewires the deleters of
storages still alive so they free their blocks; no allocator hook can do
that, so a restore that would need it (a checkpointed block whose output
storage is still alive, or a block live now that was not then) raises with
what to do instead.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import memory
from . import api


@dataclass(frozen=True)
class PoolCheckpoint:
    """What ``_cuda_getCheckpointState`` returns under the shim."""

    device: int
    pool: tuple
    live: dict  # address -> (requested size, stream)


def memory_stats(device: int) -> dict:
    return memory.memory_stats_as_nested_dict(device)


def reset_peak_memory_stats(device: int) -> None:
    api.reset_peak(device)


def reset_accumulated_memory_stats(device: int) -> None:
    api.reset_accumulated(device)


def get_memory_fraction(device: int) -> float:
    return api.memory_fraction(device) or 1.0


def memory_snapshot(*_args, **_kwargs) -> dict:
    return memory.snapshot()


def check_pool_live_allocations(device: int, pool: tuple, expected) -> bool:
    """True when the pool's live blocks are exactly ``expected`` (data pointers)."""
    return set(api.pool_live_allocations(device, tuple(pool))) == set(expected)


def _pool_blocks(device: int, pool: tuple) -> dict:
    return {
        b["address"]: (b["requested"], b["alloc_stream"])
        for seg in api.snapshot()["segments"]
        if seg["device"] == device and tuple(seg["graph_pool"]) == pool
        for b in seg["blocks"] if b["state"] == "live"
    }


def get_checkpoint_state(device: int, pool: tuple) -> PoolCheckpoint:
    pool = tuple(pool)
    return PoolCheckpoint(device, pool, _pool_blocks(device, pool))


def set_checkpoint_pool_state(device: int, state: PoolCheckpoint, stale_storages, live_storages):
    now = set(api.pool_live_allocations(device, state.pool))
    missing = set(state.live) - now  # freed since the checkpoint: held again
    alive = {torch.UntypedStorage._new_with_weak_ptr(ref).data_ptr() for ref in live_storages}
    if now - set(state.live) or stale_storages or missing & alive:
        raise RuntimeError(
            "npu_lifetime shim: cudagraph trees asked to restore a graph pool to a state that needs torch to "
            f"rewire tensor storages ({len(now - set(state.live))} block(s) live now and not at the checkpoint, "
            f"{len(missing & alive)} checkpointed block(s) held by live storages); a pluggable allocator cannot "
            "do that. Use torch.compile(mode='reduce-overhead') with "
            "torch._inductor.config.triton.cudagraph_trees = False under the shim, or install the shim without it."
        )
    for ptr in sorted(missing):
        size, stream = state.live[ptr]
        api.library().npl_claim_next(ptr)  # unchecked: a failed claim shows as got != ptr below
        got = torch._C._cuda_cudaCachingAllocator_raw_alloc(size, stream)
        if got != ptr:
            raise RuntimeError(f"npu_lifetime shim: could not hold graph pool block {ptr:#x} again ({api.findings()})")


_ROUTES = {
    "_cuda_memoryStats": memory_stats,
    "_cuda_resetPeakMemoryStats": reset_peak_memory_stats,
    "_cuda_resetAccumulatedMemoryStats": reset_accumulated_memory_stats,
    "_cuda_getMemoryFraction": get_memory_fraction,
    "_cuda_memorySnapshot": memory_snapshot,
    "_cuda_checkPoolLiveAllocations": check_pool_live_allocations,
    "_cuda_getCheckpointState": get_checkpoint_state,
    "_cuda_setCheckpointPoolState": set_checkpoint_pool_state,
}
_originals: dict = {}


def route_cuda_memory_functions() -> tuple:
    """Replaces the ``torch._C`` functions this torch has; returns their names."""
    routed = []
    for name, replacement in _ROUTES.items():
        if hasattr(torch._C, name):
            _originals.setdefault(name, getattr(torch._C, name))
            setattr(torch._C, name, replacement)
            routed.append(name)
    return tuple(routed)
