"""The allocator entry points torch reaches beyond the pluggable setters, each
program run under the shim ("shim") or under torch's own allocator
("native", the control): cudnn benchmark (cacheInfo), memory history read
by torch's own snapshot tools, MemPool/use_mem_pool, and cudagraph trees
restoring pool checkpoints with live outputs.  Each prints one JSON line.

    python tests/platforms/gpu_programs/entry_point_programs.py PROGRAM ALLOCATOR
"""
import json
import os
import pickle
import sys
import tempfile

import torch

import npu_lifetime
from npu_lifetime import shim


def setup(allocator: str) -> dict:
    if allocator == "shim":
        installed = npu_lifetime.install("cuda")
        return {"hooks": list(installed.hooks), "backend": torch.cuda.get_allocator_backend()}
    return {"hooks": [], "backend": torch.cuda.get_allocator_backend()}


def findings(allocator: str) -> list:
    return shim.findings() if allocator == "shim" else []


def cudnn_benchmark(allocator):
    """torch.backends.cudnn.benchmark sizes workspaces with cacheInfo: a conv
    net trains a few steps, results equal to benchmark off."""
    info = setup(allocator)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
                              torch.nn.Conv2d(16, 8, 3, padding=1)).cuda()
    x = torch.randn(8, 3, 64, 64, device="cuda")

    def step():
        net.zero_grad()
        y = net(x)
        y.square().mean().backward()
        return y.detach().clone(), net[0].weight.grad.clone()

    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    ref_y, ref_g = step()
    torch.backends.cudnn.benchmark = True
    same = []
    for _ in range(3):
        y, g = step()
        same.append(bool(torch.allclose(y, ref_y, atol=1e-4)) and bool(torch.allclose(g, ref_g, atol=1e-3)))
    return {**info, "same": same, "findings": findings(allocator)}


_CACHE_INFO = """
#include <c10/cuda/CUDACachingAllocator.h>
#include <cstdint>
extern "C" __attribute__((visibility("default"))) int64_t npl_test_cache_info(int device, int64_t start) {
    size_t largest = static_cast<size_t>(start);
    c10::cuda::CUDACachingAllocator::cacheInfo(static_cast<c10::DeviceIndex>(device), &largest);
    return static_cast<int64_t>(largest);
}
"""


def _cache_info_function():
    """torch's c10::cuda::CUDACachingAllocator::cacheInfo (what cudnn calls),
    compiled as the shim's bridges are (no ninja needed)."""
    import ctypes
    import subprocess

    from npu_lifetime.shim import bridge

    work = tempfile.mkdtemp()
    source, library = os.path.join(work, "cache_info.cpp"), os.path.join(work, "libcache_info.so")
    with open(source, "w") as f:
        f.write(_CACHE_INFO)
    flags = bridge._torch_flags() + bridge._torch_cuda_flags()
    subprocess.run(["c++", "-std=c++17", "-O1", "-fPIC", "-shared", source, "-o", library, *flags], check=True)
    function = ctypes.CDLL(library).npl_test_cache_info
    function.restype, function.argtypes = ctypes.c_int64, [ctypes.c_int, ctypes.c_int64]
    return function


def cache_info(allocator):
    """(issue 37) What cacheInfo answers with one 12 MiB block cached: torch's
    rule starts from the device's free memory when given 0 (cudnn's
    getMaxWorkspaceSize), else from the value given, and takes the largest
    cached block of any pool if larger."""
    info = setup(allocator)
    ask = _cache_info_function()
    x = torch.empty(12 << 20, dtype=torch.uint8, device="cuda")
    del x  # cached, 12 MiB
    torch.cuda.synchronize()
    free_before = torch.cuda.mem_get_info()[0]
    from_zero = ask(0, 0)
    free_after = torch.cuda.mem_get_info()[0]
    return {**info, "findings": findings(allocator), "from_zero": from_zero, "free_memory": [free_before, free_after],
            "from_one": ask(0, 1), "from_huge": ask(0, 1 << 50)}


def make_activations():
    return [torch.empty(1 << 20, device="cuda") for _ in range(3)]


def memory_history(allocator):
    """_record_memory_history + _snapshot + _dump_snapshot, read back by
    torch's own tools (torch.cuda._memory_viz); a block a record_use holds
    shows its event."""
    info = setup(allocator)
    torch.cuda.memory._record_memory_history(max_entries=10000)
    keep = make_activations()
    dropped = make_activations()
    del dropped
    side = torch.cuda.Stream()
    held = torch.empty(1 << 18, device="cuda")
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)
        held.add_(1)
    if allocator == "shim":
        npu_lifetime.record_use(held, side)
    held_ptr = held.data_ptr()
    del held
    snap = torch.cuda.memory._snapshot()
    path = os.path.join(tempfile.mkdtemp(), "snapshot.pickle")
    torch.cuda.memory._dump_snapshot(path)
    with open(path, "rb") as f:
        dumped = pickle.load(f)
    from torch.cuda import _memory_viz

    tools = {}
    for name in ("segsum", "trace_plot", "segment_plot"):  # the ones that need no download
        try:
            out = getattr(_memory_viz, name)(snap)
            tools[name] = len(out) > 0
        except Exception as err:  # noqa: BLE001 (the tool's own failure is the result)
            tools[name] = f"{type(err).__name__}: {err}"
    traces = snap["device_traces"][torch.cuda.current_device()]
    actions = sorted({e["action"] for e in traces})
    frames_of_alloc = [f["name"] for e in traces if e["action"] == "alloc" for f in e.get("frames", [])]
    live = {b["address"]: b for seg in snap["segments"] for b in seg["blocks"] if b["state"] == "active_allocated"}
    keep_frames = [f["name"] for f in live.get(keep[0].data_ptr(), {}).get("frames", [])]
    # the freed block may have merged with a cached neighbour: its events go with it
    held_frames = [f["name"] for seg in snap["segments"] for b in seg["blocks"]
                   if b["address"] <= held_ptr < b["address"] + b["size"] for f in b.get("frames", [])]
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(enabled=None)
    # as torch's: a live block keeps its stack once history is off (cudagraph
    # trees name a leaked block by it: test_workspace_allocation_error)
    later = {b["address"]: b for seg in torch.cuda.memory._snapshot()["segments"] for b in seg["blocks"]}
    kept_after_off = [f["name"] for f in later.get(keep[0].data_ptr(), {}).get("frames", [])]
    return {**info, "actions": actions, "alloc_frames_named": "make_activations" in frames_of_alloc,
            "live_block_frames_named": "make_activations" in keep_frames,
            "frames_kept_after_history_off": "make_activations" in kept_after_off,
            "held_shows_event": any("event" in name and "reuse waits" in name for name in held_frames),
            "dumped_same_keys": sorted(dumped) == sorted(snap), "tools": tools, "findings": findings(allocator)}


def mem_pool(allocator):
    """torch.cuda.MemPool + use_mem_pool: allocations inside go to the pool,
    its snapshot lists them, use_count follows, the pool is released."""
    info = setup(allocator)
    pool = torch.cuda.MemPool()
    counts = [pool.use_count()]
    with torch.cuda.use_mem_pool(pool):
        counts.append(pool.use_count())
        inside = torch.randn(1 << 20, device="cuda")
    counts.append(pool.use_count())
    outside = torch.randn(1 << 20, device="cuda")
    pool_blocks = {b["address"] for seg in pool.snapshot() for b in seg["blocks"] if b["state"] == "active_allocated"}
    owners = {tuple(seg.get("segment_pool_id", ())) for seg in pool.snapshot()}
    pool_id = list(pool.id)
    total = float(inside.sum() + outside.sum())
    cached = torch.empty(1 << 24, device="cuda")  # a segment of its own (64 MiB), cached once freed
    cached_segment = cached.data_ptr()
    del cached
    del inside
    del pool  # releases the pool and empties its cache: only its own (torch's test_mempool_empty_cache)
    eager_segments = {seg["address"] for seg in torch.cuda.memory._snapshot()["segments"]}
    try:  # before: refused under the shim
        torch.cuda.MemPool(use_on_oom=True)
        torch.cuda.MemPool(no_split=True)
        refused = False
    except RuntimeError:
        refused = True
    torch.cuda.synchronize()
    return {**info, "counts": counts, "pool_id": pool_id, "inside_in_pool": len(pool_blocks) == 1,
            "outside_in_pool": outside.data_ptr() in pool_blocks, "owners": [list(o) for o in sorted(owners)],
            "finite": total == total, "use_on_oom_refused": refused,
            "eager_cache_kept": cached_segment in eager_segments, "findings": findings(allocator)}


def checkpoint_restore(allocator):
    """cudagraph trees restore a pool checkpoint when a new recording follows
    graphs that ran while their outputs are still alive: inference outputs
    kept alive (never read again) into training steps, each step begun with
    torch.compiler.cudagraph_mark_step_begin(); every result equal to eager."""
    info = setup(allocator)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.GELU(), torch.nn.Linear(256, 128)).cuda()
    compiled = torch.compile(model, mode="reduce-overhead")
    same, error, kept = [], None, []
    try:
        for _ in range(4):
            torch.compiler.cudagraph_mark_step_begin()
            x = torch.randn(32, 128, device="cuda")
            with torch.no_grad():
                out = compiled(x)
                same.append(bool(torch.allclose(out, model(x), atol=1e-4)))
            kept.append(out)
        for _ in range(4):
            torch.compiler.cudagraph_mark_step_begin()
            x = torch.randn(32, 128, device="cuda")
            compiled(x).sum().backward()
            grad = model[0].weight.grad.clone()
            model.zero_grad()
            model(x).sum().backward()
            same.append(bool(torch.allclose(grad, model[0].weight.grad, atol=1e-3, rtol=1e-3)))
            model.zero_grad()
    except RuntimeError as err:
        error = str(err)[:2000]
    checkpoints = torch._inductor.cudagraph_trees.get_container(0).tree_manager.debug_checkpointing_counter
    return {**info, "same": same, "error": error, "checkpoints": checkpoints, "findings": findings(allocator)}


def _pool_layout(pool) -> list:
    """The pool's blocks as (offset in its segment, size, state), segments by size."""
    segments = [seg for seg in torch.cuda.memory_snapshot() if tuple(seg.get("segment_pool_id", ())) == tuple(pool)]
    return sorted([(b["address"] - seg["address"], b["size"], b["state"]) for b in seg["blocks"]]
                  for seg in segments)


def checkpoint_layout(allocator):
    """(issue 37) A pool checkpoint taken, its tensors freed, and restored as
    cudagraph trees restore one (the blocks allocated again and handed to
    storages that do not own memory, as graph outputs are): the layout and
    allocated_bytes come back as they were.  A 20 MiB segment holds 7.5 MiB,
    7.5 MiB and 4608 KiB in the last 5120 KiB (a block too small to split)."""
    info = setup(allocator)
    pool = torch.cuda.graph_pool_handle()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        kept = [torch.empty(n << 10, dtype=torch.uint8, device="cuda") for n in (7680, 7680, 4608)]
    torch.cuda.synchronize()
    before = {"layout": _pool_layout(pool), "allocated": torch.cuda.memory_allocated()}
    state = torch._C._cuda_getCheckpointState(0, pool)
    outputs = [torch._C._construct_storage_from_data_pointer(t.data_ptr(), t.device, t.untyped_storage().nbytes())
               for t in kept]  # no deleter, as cudagraph trees' outputs
    del kept
    torch.cuda.synchronize()
    freed = {"allocated": torch.cuda.memory_allocated()}
    error = None
    try:
        torch._C._cuda_setCheckpointPoolState(0, state, [], [s._cdata for s in outputs])
    except RuntimeError as err:
        error = str(err)[:2000]
    after = {"layout": _pool_layout(pool), "allocated": torch.cuda.memory_allocated()}
    refused = None
    del graph, outputs
    torch.cuda.synchronize()
    gc_collect()
    try:
        torch._C._cuda_getCheckpointState(0, (12345, 6789))  # a pool never made
    except RuntimeError as err:
        refused = str(err)[:300]
    return {**info, "before": before, "freed": freed, "after": after, "error": error,
            "unknown_pool_refused": refused,
            "findings": findings(allocator)}


def history_sequence(allocator):
    """(issue 37) torch's memory history for: one randn(1 << 20) and its
    del, an allocation too large for the device (the cached segment goes
    back, then the OOM), the randn again and empty_cache: each entry's
    action and size, in order."""
    info = setup(allocator)
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(max_entries=100000)
    x = torch.randn(1 << 20, device="cuda")
    del x
    oom = None
    try:
        torch.empty(1 << 50, dtype=torch.uint8, device="cuda")
    except Exception as err:  # noqa: BLE001 (its type is the answer: OutOfMemoryError under both)
        oom = f"{type(err).__name__}: {str(err)[:200]}"
    y = torch.randn(1 << 20, device="cuda")
    del y
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.memory._snapshot()  # its own entry shows in the next snapshot's traces, not its own
    traces = torch.cuda.memory._snapshot()["device_traces"][0]
    torch.cuda.memory._record_memory_history(enabled=None)
    entries = [[e["action"], e.get("size")] for e in traces]
    return {**info, "entries": entries, "oom": oom, "findings": findings(allocator)}


def gc_collect():
    import gc

    gc.collect()


def stats_and_fraction(allocator):
    """torch's test_memory_stats and test_get_per_process_memory_fraction:
    torch.accelerator's statistics (C++ getDeviceStats) follow a 1 KiB
    tensor; a fraction set to 0 reads back 0 (torch's meaning: nothing may
    be reserved), 1 is the default."""
    info = setup(allocator)
    torch.empty(1, device="cuda")  # torch's allocator reports nothing (initialized() false) before its first use
    before = torch.accelerator.memory_stats().get("active_bytes.all.current")
    t = torch.randn(256, device="cuda")
    after = torch.accelerator.memory_stats().get("active_bytes.all.current")
    del t
    initial = torch.cuda.get_per_process_memory_fraction()
    fractions = []
    for value in (1.0, 0.0, 0.25):
        torch.cuda.set_per_process_memory_fraction(value)
        fractions.append(torch.cuda.get_per_process_memory_fraction())
    torch.cuda.set_per_process_memory_fraction(initial)
    return {**info, "active_grew_by": None if before is None or after is None else after - before,
            "initial_fraction": initial, "fractions": fractions, "findings": findings(allocator)}


if __name__ == "__main__":
    import faulthandler

    faulthandler.enable()  # a crash, even at exit, prints where on stderr
    try:
        print(json.dumps(globals()[sys.argv[1]](*sys.argv[2:])), flush=True)
    except BaseException:  # the traceback on stdout too: a GPU run's log shows why, not only the exit status
        import traceback

        print(traceback.format_exc(), flush=True)
        raise
