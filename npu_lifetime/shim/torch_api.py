"""torch's allocator entry points that a pluggable allocator cannot serve
through hooks, answered from the shim.

Under ``CUDAPluggableAllocator`` torch 2.11 raises "pluggable does not yet
support ..." for its memory statistics, snapshot, memory fraction query,
and for the pool checks cudagraph trees (``torch.compile(mode=
"reduce-overhead")``) make.  Under torch_npu's ``NPUPluggableAllocator``
the same statistics read an uninitialised struct (the process aborts) and
the snapshot double-frees.  ``install()`` replaces these ``torch._C`` /
``torch_npu._C`` functions (looked up at each call) with the versions
below; each keeps the framework's signature and meaning.

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

The CUDA bridge (``bridge.CUDA_BRIDGE``) answers the snapshot, the pool
checks and checkpoints in C++, where torch's own code rewires storages and
turns recorded stacks into frames; with it, only the statistics are routed
here, and the snapshot is torch's with each block's recorded streams and
events added as frames (``snapshot_with_events``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from . import api, memory


@dataclass(frozen=True)
class PoolCheckpoint:
    """What ``_cuda_getCheckpointState`` returns under the shim."""

    device: int
    pool: tuple
    live: dict  # address -> (block size, stream)


def memory_stats(device: int) -> dict:
    return memory.memory_stats_as_nested_dict(device)


def reset_peak_memory_stats(device: int) -> None:
    api.reset_peak(device)


def reset_accumulated_memory_stats(device: int) -> None:
    api.reset_accumulated(device)


def get_memory_fraction(device: int) -> float:
    return api.memory_fraction(device)  # as torch's: 1 by default, 0 once set to 0


def memory_snapshot(*_args, **_kwargs) -> dict:
    return memory.snapshot()


def check_pool_live_allocations(device: int, pool: tuple, expected) -> bool:
    """True when the pool's live blocks are exactly ``expected`` (data pointers)."""
    return set(api.pool_live_allocations(device, tuple(pool))) == set(expected)


def get_checkpoint_state(device: int, pool: tuple) -> PoolCheckpoint:
    pool = tuple(pool)
    return PoolCheckpoint(device, pool, api.pool_checkpoint(device, pool))


def set_checkpoint_pool_state(device: int, state: PoolCheckpoint, stale_storages, live_storages):
    api.pool_checkpoint(device, state.pool)  # torch's checks: the pool is there and not released
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


def snapshot_with_events(*args, **kwargs) -> dict:
    """torch's snapshot (the CUDA bridge's), each block's frames led by what
    the shim holds it for: recorded streams, use events, held events."""
    from ..viz.memory_viz import event_notes

    data = _originals["_cuda_memorySnapshot"](*args, **kwargs)
    shim_blocks = {b["address"]: b for seg in api.snapshot()["segments"] for b in seg["blocks"]}
    for seg in data.get("segments", []):
        for block in seg["blocks"]:
            shim_block = shim_blocks.get(block["address"])
            if shim_block is not None:
                block["frames"] = event_notes(shim_block) + list(block.get("frames", []))
    return data


# Under the CUDA bridge: what it answers itself, and what is routed instead.
BRIDGE_ANSWERS = ("checkPoolLiveAllocations", "getCheckpointState", "setCheckpointPoolState")
BRIDGE_ROUTES = {"memorySnapshot": snapshot_with_events}

_ROUTES = {  # torch._C (cuda) / torch_npu._C (npu) function, by what it does
    "memoryStats": memory_stats,
    "resetPeakMemoryStats": reset_peak_memory_stats,
    "resetAccumulatedMemoryStats": reset_accumulated_memory_stats,
    "getMemoryFraction": get_memory_fraction,
    "memorySnapshot": memory_snapshot,
    "checkPoolLiveAllocations": check_pool_live_allocations,
    "getCheckpointState": get_checkpoint_state,
    "setCheckpointPoolState": set_checkpoint_pool_state,
}
_originals: dict = {}


def _module(device: str):
    if device == "cuda":
        return torch._C, "_cuda_"
    import torch_npu

    return torch_npu._C, "_npu_"


def route_memory_functions(device: str, cuda_bridge: bool = False) -> tuple:
    """Replaces the device's ``_C`` functions this build has (torch_npu's
    ``torch.npu.memory_stats`` & co. call ``torch_npu._C._npu_memoryStats``
    at each call); returns their names.  ``cuda_bridge``: the CUDA bridge
    is torch's allocator and answers some of them itself."""
    module, prefix = _module(device)
    routes = dict(_ROUTES)
    if cuda_bridge:
        routes = {k: v for k, v in routes.items() if k not in BRIDGE_ANSWERS}
        routes.update(BRIDGE_ROUTES)
    routed = []
    for suffix, replacement in routes.items():
        name = prefix + suffix
        if hasattr(module, name):
            _originals.setdefault(name, getattr(module, name))
            setattr(module, name, replacement)
            routed.append(name)
    return tuple(routed)
