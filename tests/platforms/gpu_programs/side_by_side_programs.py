"""The shim beside torch's own allocator, one row of design/allocator-shim.md's
entry-point table at a time (issue 37): each row's program drives the
`CUDAAllocator` methods that row names through torch's public routes and
answers what torch reports (statistics, snapshot fields, trace entries,
checkpoint layouts, errors).  tests/shim/test_gpu_side_by_side.py runs this once
per allocator, each in a fresh process, and compares the answers row by row.

    python tests/platforms/gpu_programs/side_by_side_programs.py shim|native [ROW_KEY ...]

prints one JSON object {row key: answer}; a row that raised answers
{"error": its traceback} instead (the other rows still run), so a GPU run's
output alone tells what differed and why.
"""
import faulthandler
import json
import sys
import traceback

import torch

import entry_point_programs as ep

MiB = 1 << 20


def fresh():
    """Each row starts from an empty cache and zeroed statistics, as a fresh
    process would (rows share one process per allocator)."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.reset_accumulated_memory_stats()


def stat(name):
    return torch.cuda.memory_stats().get(name)


def _blocks(seg):
    return [[b["size"], b["state"]] for b in seg["blocks"]]


def _stream_role(handle: int) -> str:
    """A stream as the same role in both processes (its handle differs):
    the current stream, the null stream, or another one."""
    if handle == torch.cuda.current_stream().cuda_stream:
        return "current"
    return "null" if handle == 0 else "another"


def _segments(pool=None):
    """Snapshot segments as comparable values: type, total size, stream's
    role, blocks (size, state) in address order; the address is only checked
    to be there (it differs between processes, as stream handles do)."""
    out = []
    for seg in torch.cuda.memory_snapshot():
        if pool is not None and tuple(seg.get("segment_pool_id", ())) != tuple(pool):
            continue
        out.append({"address_present": isinstance(seg.get("address"), int) and seg["address"] > 0,
                    "total_size": seg["total_size"], "stream": _stream_role(seg["stream"]),
                    "segment_type": seg["segment_type"], "blocks": _blocks(seg)})
    return sorted(out, key=lambda s: (s["total_size"], s["blocks"]))


def row_allocate(_):
    """allocate/raw_alloc/raw_delete/malloc: tensors, caching_allocator_alloc,
    the statistics they move, and the out-of-memory error."""
    fresh()
    t = torch.empty(1000, dtype=torch.uint8, device="cuda")
    grew = stat("allocated_bytes.all.current")
    ptr = torch.cuda.caching_allocator_alloc(3 * MiB)
    raw_grew = stat("allocated_bytes.all.current") - grew
    torch.cuda.caching_allocator_delete(ptr)
    del t
    torch.cuda.synchronize()
    oom_type, oom_message = None, ""
    try:
        torch.empty(1 << 45, dtype=torch.uint8, device="cuda")  # 32 TiB: no device has it
    except Exception as err:  # noqa: BLE001 (its type is the answer)
        oom_type, oom_message = type(err).__name__, str(err)
    return {"tensor_grew": grew, "raw_grew": raw_grew, "after_deletes": stat("allocated_bytes.all.current"),
            "oom_type": oom_type, "oom_says_out_of_memory": "out of memory" in oom_message.lower(),
            "oom_message": oom_message[:300], "num_ooms": stat("num_ooms")}


def row_fraction_and_record_stream(_):
    """setMemoryFraction (fraction 0 reserves nothing: the next segment is an
    out-of-memory error), getMemoryFraction, recordStream (a block
    record_stream-ed on a busy stream is not handed out again)."""
    fresh()
    initial = torch.cuda.get_per_process_memory_fraction()
    fractions = []
    for value in (1.0, 0.0, 0.25):
        torch.cuda.set_per_process_memory_fraction(value)
        fractions.append(torch.cuda.get_per_process_memory_fraction())
    torch.cuda.set_per_process_memory_fraction(0.0)
    try:
        torch.empty(MiB, dtype=torch.uint8, device="cuda")
        zero_refuses = False
    except torch.OutOfMemoryError:
        zero_refuses = True
    torch.cuda.set_per_process_memory_fraction(initial)
    side = torch.cuda.Stream()
    t = torch.empty(MiB, dtype=torch.uint8, device="cuda")
    with torch.cuda.stream(side):  # load both kernels first: with CUDA's lazy loading, a kernel's first launch
        torch.cuda._sleep(1)       # may wait for the device's running work, and the sleep would be over
        t.add_(1)
    side.synchronize()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)
        t.add_(1)
    t.record_stream(side)
    old = t.data_ptr()
    del t
    side_busy = not side.query()
    again = torch.empty(MiB, dtype=torch.uint8, device="cuda")
    reused_while_busy = again.data_ptr() == old
    torch.cuda.synchronize()
    return {"initial": initial, "fractions": fractions, "zero_refuses": zero_refuses,
            "side_busy": side_busy, "reused_while_busy": reused_while_busy}


def row_empty_cache(_):
    """emptyCache: the eager cache's free segments go back; a MemPool's
    emptyCache (at its release) leaves the eager cache alone."""
    fresh()
    base = stat("reserved_bytes.all.current")
    t = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
    del t
    cached = stat("reserved_bytes.all.current") - base
    torch.cuda.empty_cache()
    after = stat("reserved_bytes.all.current") - base
    kept = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
    del kept  # cached in the eager pool
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        inside = torch.empty(MiB, device="cuda")
    del inside
    del pool
    torch.cuda.synchronize()
    return {"cached": cached, "after_empty_cache": after,
            "eager_kept_at_pool_release": stat("reserved_bytes.all.current") - base >= 64 * MiB,
            "segment_releases": stat("num_device_free")}


def row_pools(_):
    """beginAllocateToPool/endAllocateToPool/releasePool: a capture's
    allocations go to its pool; after the graph goes the pool's segments
    go back at empty_cache."""
    fresh()
    pool = torch.cuda.graph_pool_handle()
    graph = torch.cuda.CUDAGraph()
    static = torch.zeros(MiB, device="cuda")
    with torch.cuda.graph(graph, pool=pool):
        out = static * 2
    graph.replay()
    torch.cuda.synchronize()
    in_pool = _segments(pool)
    out_in_pool = any(seg["address"] <= out.data_ptr() < seg["address"] + seg["total_size"]
                      for seg in torch.cuda.memory_snapshot()
                      if tuple(seg.get("segment_pool_id", ())) == tuple(pool))
    del out, graph
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return {"pool_segments": in_pool, "out_in_pool": out_in_pool, "released": _segments(pool) == []}


def row_cache_info(_):
    """cacheInfo, torch's rule: given 0 the device's free memory, given 1 the
    largest cached block (one 12 MiB block cached), given more, that."""
    fresh()
    ask = ep._cache_info_function()
    x = torch.empty(12 * MiB, dtype=torch.uint8, device="cuda")
    del x
    torch.cuda.synchronize()
    free_before = torch.cuda.mem_get_info()[0]
    from_zero = ask(0, 0)
    free_after = torch.cuda.mem_get_info()[0]
    return {"from_zero_is_free_memory": min(free_before, free_after) - 64 * MiB <= from_zero
            <= max(free_before, free_after) + 64 * MiB,
            "from_zero": from_zero, "free_memory": [free_before, free_after],
            "from_one": ask(0, 1), "from_huge": ask(0, 1 << 50)}


def row_history(_):
    """recordHistory/isHistoryEnabled: trace entries one for one (actions and
    sizes), the history switch read back."""
    fresh()
    enabled = getattr(torch._C, "_cuda_isHistoryEnabled", None)
    torch.cuda.memory._record_memory_history(max_entries=100000)
    on = enabled() if enabled else None
    x = torch.randn(MiB, device="cuda")
    del x
    try:
        torch.empty(1 << 45, dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError:
        pass
    y = torch.randn(MiB, device="cuda")
    del y
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    traces = torch.cuda.memory._snapshot()["device_traces"][torch.cuda.current_device()]
    torch.cuda.memory._record_memory_history(enabled=None)
    off = enabled() if enabled else None
    entries = [[e["action"], e.get("size")] for e in traces]
    return {"enabled": [on, off], "entries": [e for e in entries if e[0] != "snapshot"],
            "snapshots": sum(e[0] == "snapshot" for e in entries)}


def row_snapshot(_):
    """snapshot: memory_snapshot's segments and blocks (sizes, states,
    stream, type) for a fixed set of live and freed tensors."""
    fresh()
    keep = [torch.empty(n, dtype=torch.uint8, device="cuda") for n in (512, 3 * MiB, 25 * MiB)]
    drop = torch.empty(MiB, dtype=torch.uint8, device="cuda")
    del drop
    torch.cuda.synchronize()
    segments = _segments()
    snap = torch.cuda.memory._snapshot()
    del keep
    return {"segments": segments, "snapshot_keys": sorted(snap),
            "segment_keys_present": sorted({"address", "total_size", "stream", "segment_type", "blocks",
                                            "allocated_size", "active_size", "requested_size", "device"}
                                           & set(snap["segments"][0]) if snap["segments"] else set())}


def row_pool_references(_):
    """createOrIncrefPool/getPoolUseCount: MemPool.use_count as use_mem_pool
    takes and drops the pool."""
    fresh()
    pool = torch.cuda.MemPool()
    counts = [pool.use_count()]
    with torch.cuda.use_mem_pool(pool):
        counts.append(pool.use_count())
        t = torch.empty(MiB, device="cuda")
    counts.append(pool.use_count())
    in_pool = [seg["total_size"] for seg in pool.snapshot()]
    del t, pool
    return {"counts": counts, "pool_segments": in_pool}


def row_use_on_oom(_):
    """setUseOnOOM: MemPool(use_on_oom=True) is accepted and its cached
    blocks stay its own while unused."""
    fresh()
    pool = torch.cuda.MemPool(use_on_oom=True)
    with torch.cuda.use_mem_pool(pool):
        t = torch.empty(MiB, device="cuda")
    del t
    torch.cuda.synchronize()
    return {"pool_segments": [seg["total_size"] for seg in pool.snapshot()]}


def row_no_split(_):
    """setNoSplit: MemPool(no_split=True) gives each allocation a segment of
    its own."""
    fresh()
    pool = torch.cuda.MemPool(no_split=True)
    with torch.cuda.use_mem_pool(pool):
        ts = [torch.empty(4096, dtype=torch.uint8, device="cuda") for _ in range(2)]
    layout = sorted(_blocks(seg) for seg in pool.snapshot())
    del ts
    return {"layout": layout}


def row_check_pool_live(_):
    """checkPoolLiveAllocations: true for exactly the pool's live blocks."""
    fresh()
    pool = torch.cuda.graph_pool_handle()
    graph = torch.cuda.CUDAGraph()
    static = torch.zeros(MiB, device="cuda")
    with torch.cuda.graph(graph, pool=pool):
        a, b = static + 1, static + 2
    torch.cuda.synchronize()
    check = torch._C._cuda_checkPoolLiveAllocations
    answers = [check(0, pool, {a.data_ptr(), b.data_ptr()}), check(0, pool, {a.data_ptr()})]
    del a, b, graph
    return {"answers": answers}


def row_checkpoint(_):
    """getCheckpointState/setCheckpointPoolState: entry_point_programs'
    round trip (layout and allocated_bytes as they were)."""
    fresh()
    base = torch.cuda.memory_allocated()  # what earlier rows left live: counted out
    r = ep.checkpoint_layout("as_installed")
    for phase in ("before", "freed", "after"):
        r[phase]["allocated"] -= base
    return {k: r[k] for k in ("before", "freed", "after", "error")} | {
        "unknown_pool_refused": r["unknown_pool_refused"] is not None}


def row_device_stats(_):
    """getDeviceStats/resetPeakStats/resetAccumulatedStats/getMemoryFraction:
    the statistics both fill, as each reset leaves them."""
    fresh()
    keys = ("allocated_bytes.all.current", "allocated_bytes.all.peak", "reserved_bytes.all.current",
            "reserved_bytes.all.peak", "active_bytes.all.current", "active_bytes.all.peak",
            "allocation.all.current", "allocation.all.allocated", "allocation.all.freed",
            "segment.all.current", "num_alloc_retries", "num_ooms", "num_device_alloc")

    def read():
        s = torch.cuda.memory_stats()
        return {k: s.get(k) for k in keys}

    a = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")
    b = torch.empty(25 * MiB, dtype=torch.uint8, device="cuda")
    del b
    torch.cuda.synchronize()
    held = read()
    torch.cuda.reset_peak_memory_stats()
    after_peak_reset = read()
    torch.cuda.reset_accumulated_memory_stats()
    after_accumulated_reset = read()
    cxx = torch.accelerator.memory_stats()  # C++ getDeviceStats
    del a
    return {"held": held, "after_peak_reset": after_peak_reset,
            "after_accumulated_reset": after_accumulated_reset,
            "accelerator_allocated": cxx.get("allocated_bytes.all.current"),
            "fraction": torch.cuda.get_per_process_memory_fraction()}


def row_ipc(_):
    """shareIpcHandle/getIpcDevPtr: CUDA IPC of a storage."""
    fresh()
    t = torch.ones(MiB, device="cuda")
    try:
        handle = t.untyped_storage()._share_cuda_()
        return {"shared": True, "fields": len(handle)}
    except RuntimeError as err:
        return {"shared": False, "message": str(err)[:300]}


def row_observers(_):
    """attachOutOfMemoryObserver/attachAllocatorTraceTracker: an OOM observer
    attached through torch's Python route, called at an out-of-memory error."""
    fresh()
    seen = []
    try:
        torch._C._cuda_attach_out_of_memory_observer(lambda *args: seen.append(len(args)))
        attached = True
    except RuntimeError as err:
        attached = str(err)[:300]
    try:
        torch.empty(1 << 45, dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError:
        pass
    return {"attached": attached, "called": bool(seen)}


def row_expandable(_):
    """expandable segments through _set_allocator_settings: a segment made
    while on is expandable, one made after turning it off is not."""
    fresh()
    torch.cuda.memory._set_allocator_settings("expandable_segments:True")
    a = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")
    on = [seg.get("is_expandable") for seg in torch.cuda.memory_snapshot()
          if seg["address"] <= a.data_ptr() < seg["address"] + seg["total_size"]]
    torch.cuda.memory._set_allocator_settings("expandable_segments:False")
    b = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")
    off = [seg.get("is_expandable", False) for seg in torch.cuda.memory_snapshot()
           if seg["address"] <= b.data_ptr() < seg["address"] + seg["total_size"]]
    del a, b
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return {"on": on, "off": off}


def row_expandable_sizes(_):
    """getExpandableSegmentSizes: torch's Python route, where it has one."""
    fresh()
    route = getattr(torch._C, "_cuda_get_expandable_segment_sizes", None) or getattr(
        torch._C, "_cuda_getExpandableSegmentSizes", None)
    if route is None:
        return {"route": None}
    try:
        return {"route": True, "sizes": list(route(0))}
    except RuntimeError as err:
        return {"route": True, "error_message": str(err)[:300]}


def row_nested_pools(_):
    """beginAllocateToPool nesting: the innermost use_mem_pool takes the
    allocation, the outer one takes it again after."""
    fresh()
    outer, inner = torch.cuda.MemPool(), torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(outer):
        with torch.cuda.use_mem_pool(inner):
            x = torch.empty(MiB, device="cuda")
        y = torch.empty(MiB, device="cuda")

    def owners(t):
        return [name for name, p in (("outer", outer), ("inner", inner))
                for seg in p.snapshot() for blk in seg["blocks"]
                if blk["address"] == t.data_ptr() and blk["state"] == "active_allocated"]

    answer = {"x": owners(x), "y": owners(y)}
    del x, y
    return answer


def row_capture_reuse(_):
    """graph_capture_record_stream_reuse: with torch's setting on, a block
    freed in a capture after record_stream on a side stream the capture
    then joins is handed out again in the same capture."""
    fresh()
    try:
        torch.cuda.memory._set_allocator_settings("graph_capture_record_stream_reuse:True")
        accepted = True
    except RuntimeError as err:
        return {"accepted": str(err)[:200]}
    graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    static = torch.zeros(MiB, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        a = static + 1
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            a.mul_(2)
        a.record_stream(side)
        old = a.data_ptr()
        del a
        torch.cuda.current_stream().wait_stream(side)
        b = static + 3
        reused = b.data_ptr() == old
    torch.cuda.memory._set_allocator_settings("graph_capture_record_stream_reuse:False")
    graph.replay()
    torch.cuda.synchronize()
    return {"accepted": accepted, "reused": reused, "result": float(b[0])}


# The key of each row is the start of its first cell in design/allocator-shim.md's
# table, backquotes kept (tests/shim/test_gpu_side_by_side.py checks it covers the
# table).  Rows run in this order in one process; the last three leave state
# behind (an OOM observer, IPC-shared memory, a restored checkpoint's blocks,
# which belong to storages that never free them), so they come last.
ROWS = {
    "`allocate`, `raw_alloc`, `raw_delete`, `malloc`": row_allocate,
    "`init`, `setMemoryFraction`, `getBaseAllocation`, `recordStream`": row_fraction_and_record_stream,
    "`emptyCache(mempool_id)`": row_empty_cache,
    "`beginAllocateToPool`, `endAllocateToPool`, `releasePool`": row_pools,
    "`cacheInfo`": row_cache_info,
    "`recordHistory`, `isHistoryEnabled`": row_history,
    "`snapshot`": row_snapshot,
    "`createOrIncrefPool`, `getPoolUseCount`": row_pool_references,
    "`setUseOnOOM`": row_use_on_oom,
    "`setNoSplit`": row_no_split,
    "`checkPoolLiveAllocations`": row_check_pool_live,
    "`getDeviceStats`, `resetPeakStats`, `resetAccumulatedStats`, `getMemoryFraction`": row_device_stats,
    "expandable segments": row_expandable,
    "`getExpandableSegmentSizes`": row_expandable_sizes,
    "`beginAllocateToPool` nesting": row_nested_pools,
    "`graph_capture_record_stream_reuse` (allocator setting)": row_capture_reuse,
    "`attachOutOfMemoryObserver`, `attachAllocatorTraceTracker`": row_observers,
    "`getCheckpointState`, `setCheckpointPoolState`": row_checkpoint,
    "`shareIpcHandle`, `getIpcDevPtr`": row_ipc,
}


def run_rows(allocator, keys):
    try:
        out = {"setup": ep.setup(allocator)}
    except Exception:  # noqa: BLE001 (no row can run: the traceback is the answer)
        return {"setup": {"error": traceback.format_exc()[-3000:]}}
    for key in keys:
        try:
            out[key] = ROWS[key](allocator)
        except Exception:  # noqa: BLE001 (the traceback is the answer; the other rows still run)
            out[key] = {"error": traceback.format_exc()[-3000:]}
    out["findings"] = ep.findings(allocator)
    if allocator == "shim":  # install("cuda") trusts torch's pool begin/end as torch's allocator does (design D19)
        out["captures_announced"] = ep.shim.captures_announced()
    return out


if __name__ == "__main__":
    faulthandler.enable()  # a crash (not an exception) still names its row's line on stderr
    print(json.dumps(run_rows(sys.argv[1], sys.argv[2:] or list(ROWS)), default=str))
