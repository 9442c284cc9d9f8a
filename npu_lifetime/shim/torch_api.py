"""torch's allocator entry points that a pluggable allocator cannot serve
through hooks, answered from the shim.

Under ``CUDAPluggableAllocator`` torch 2.11 raises "pluggable does not yet
support ..." for its memory statistics, snapshot, memory fraction query,
and for the pool checks cudagraph trees (``torch.compile(mode=
"reduce-overhead")``) make.  ``install("cuda")`` replaces these
``torch._C`` functions (looked up by torch at each call) with the versions
below; each keeps torch's signature and meaning.  Pool checkpoints: a
checkpoint records a pool's live blocks; restoring one is possible only when
the pool is already in that state (cudagraph trees restore a checkpoint when
a new recording follows graphs that executed with live outputs; that needs
storage deleters rewired inside torch, which no allocator hook can do): any
other restore raises with what to do.
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
    live: frozenset


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


def get_checkpoint_state(device: int, pool: tuple) -> PoolCheckpoint:
    pool = tuple(pool)
    return PoolCheckpoint(device, pool, frozenset(api.pool_live_allocations(device, pool)))


def set_checkpoint_pool_state(device: int, state: PoolCheckpoint, stale_storages, live_storages):
    now = frozenset(api.pool_live_allocations(device, state.pool))
    if now == state.live:
        return None  # already in the checkpointed state
    raise RuntimeError(
        "npu_lifetime shim: cudagraph trees asked to restore a graph pool to an earlier state "
        f"({len(now)} live blocks now, {len(state.live)} at the checkpoint). Restoring needs torch to rewire "
        "tensor storages, which a pluggable allocator cannot do. This happens when a new CUDA graph is "
        "recorded while outputs of executed graphs are alive (graph breaks, chained compiled functions, "
        "re-recording). Use torch.compile(mode='reduce-overhead') with "
        "torch._inductor.config.triton.cudagraph_trees = False under the shim, or install the shim without it."
    )


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
