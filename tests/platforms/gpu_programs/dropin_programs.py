"""The shim as a drop-in allocator for real PyTorch programs (each program in
a fresh process, the shim installed first): torch's own hooks, CUDA graphs
(torch.cuda.graph, make_graphed_callables, cudagraph trees), torch's memory
functions, out of memory, and debug mode.  Each prints one JSON line.

    python tests/platforms/gpu_programs/dropin_programs.py PROGRAM [ARGS...]
"""
import json
import os
import sys

import torch

import npu_lifetime
from npu_lifetime import shim

FIFTY_MIL_CYCLES = 50_000_000


def block_of(ptr):
    for seg in shim.snapshot()["segments"]:
        for b in seg["blocks"]:
            if b["address"] <= ptr < b["address"] + b["size"]:
                return b
    return None


def hooks():
    """Every hook reaches the shim: record_stream from Python and from C++
    (gloo's recordDataPtrOnStream on a CUDA tensor), empty_cache, the memory
    fraction, base allocation."""
    setup = npu_lifetime.install("cuda")
    side = torch.cuda.Stream()
    x = torch.ones(1 << 20, device="cuda")
    x[10:].record_stream(side)  # Python, through a view
    from_python = block_of(x.data_ptr())["recorded_streams"]
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("gloo", rank=0, world_size=1)
    y = torch.ones(1 << 16, device="cuda")
    dist.all_reduce(y)  # C++: ProcessGroupGloo records y on its own CUDA stream
    torch.cuda.synchronize()
    from_cpp = block_of(y.data_ptr())["recorded_streams"]
    dist.destroy_process_group()
    del x
    torch.cuda.synchronize()
    shim.process_events()
    reserved = torch.cuda.memory_reserved()
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(0.5)
    z = torch.empty(1000, device="cuda")
    base, size = shim.base_allocation(z.data_ptr() + 512)
    return {"wired": list(setup.hooks), "from_python": from_python, "side": side.cuda_stream,
            "from_cpp": from_cpp, "reserved_before": reserved,
            "reserved_after_empty_cache": torch.cuda.memory_reserved(),
            "fraction": shim.memory_fraction(0), "base_ok": base <= z.data_ptr() < base + size,
            "findings": shim.findings()}


def graph_record_stream(policy):
    """torch's test_graph_record_stream, under the shim: a block recorded on
    a busy stream is pending when a capture starts; a tensor record_streamed
    and freed inside the capture.  No event recorded in the capture may be
    queried; the capture must not fail; the allocation after it must work."""
    npu_lifetime.install("cuda", policy=policy)
    torch.cuda.empty_cache()
    potential_problem = torch.zeros((3,), device="cuda")
    a = torch.zeros((3,), device="cuda")
    s0, s1, s2 = torch.cuda.Stream(), torch.cuda.Stream(), torch.cuda.Stream()
    g = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.stream(s0):
        potential_problem.record_stream(s0)
        torch.cuda._sleep(FIFTY_MIL_CYCLES)
        potential_problem.fill_(1.0)
    del potential_problem
    with torch.cuda.stream(s1):
        g.capture_begin()
        b = a.clone()
        s2.wait_stream(s1)
        with torch.cuda.stream(s2):
            b.fill_(1.0)
            b.record_stream(s2)
            del b
        s1.wait_stream(s2)
        g.capture_end()
    torch.cuda.synchronize()
    c = torch.zeros((3,), device="cuda")
    g.replay()
    torch.cuda.synchronize()
    return {"ok": float(c.sum()) == 0.0, "findings": shim.findings(),
            "deferred": shim.stats()["capture_deferred_frees"]}


def graph_memory_is_not_clobbered(policy):
    """A captured graph with temporaries; then eager allocations of every
    size written with garbage; a replay must still compute the right result
    (no eager tensor got memory the graph writes, and vice versa)."""
    npu_lifetime.install("cuda", policy=policy)
    static_in = torch.randn(1 << 16, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm up
        for _ in range(2):
            (static_in * 2 + 1).sin()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        t1 = static_in * 2  # temporaries freed inside the capture
        t2 = t1 + 1
        del t1
        static_out = t2.sin()
        del t2
    pool = g.pool()
    eager = [torch.full((n,), float("nan"), device="cuda") for n in (1 << 16, 1 << 15, 3 << 16, 1 << 20)]
    results = []
    for _ in range(3):
        static_in.copy_(torch.randn(1 << 16, device="cuda"))
        g.replay()
        ref = (static_in * 2 + 1).sin()
        for e in eager:
            e.fill_(float("nan"))
        results.append(bool(torch.equal(static_out, ref)))
    live = shim.pool_live_allocations(0, tuple(pool))
    return {"correct": results, "pool_live": len(live), "static_out_in_pool": static_out.data_ptr() in live,
            "eager_in_pool": any(e.data_ptr() in live for e in eager), "findings": shim.findings()}


def graphed_callables(policy):
    """make_graphed_callables over a small MLP: outputs and gradients equal eager's."""
    npu_lifetime.install("cuda", policy=policy)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8)).cuda()
    reference = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8)).cuda()
    reference.load_state_dict(model.state_dict())
    x = torch.randn(32, 64, device="cuda", requires_grad=True)
    graphed = torch.cuda.make_graphed_callables(model, (x,))
    same = []
    for _ in range(3):
        inp = torch.randn(32, 64, device="cuda", requires_grad=True)
        out = graphed(inp)
        out.sum().backward()
        ref_inp = inp.detach().clone().requires_grad_(True)
        ref = reference(ref_inp)
        ref.sum().backward()
        same.append(bool(torch.allclose(out, ref, atol=1e-5))
                    and bool(torch.allclose(inp.grad, ref_inp.grad, atol=1e-5)))
    return {"same": same, "findings": shim.findings()}


def reduce_overhead(policy, mode):
    """torch.compile(mode="reduce-overhead") (cudagraph trees) on a small
    model, one compiled function called repeatedly, forward only
    ("inference") or forward + backward ("train"): outputs equal eager's.
    "mixed" then trains after inferring, which makes cudagraph trees restore
    a pool checkpoint (see npu_lifetime/shim/torch_api.py)."""
    npu_lifetime.install("cuda", policy=policy)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256)).cuda()
    compiled = torch.compile(model, mode="reduce-overhead")
    same = []
    error = None
    try:
        if mode in ("inference", "mixed"):
            with torch.no_grad():
                for _ in range(6):
                    x = torch.randn(64, 256, device="cuda")
                    out = compiled(x).clone()
                    same.append(bool(torch.allclose(out, model(x), atol=1e-4, rtol=1e-4)))
        if mode in ("train", "mixed"):
            for _ in range(6):
                x = torch.randn(64, 256, device="cuda")
                y = compiled(x)
                y.sum().backward()
                out, grad = y.detach().clone(), model[0].weight.grad.clone()
                model.zero_grad()
                ref = model(x)
                ref.sum().backward()
                same.append(bool(torch.allclose(out, ref, atol=1e-4, rtol=1e-4))
                            and bool(torch.allclose(grad, model[0].weight.grad, atol=1e-3, rtol=1e-3)))
                model.zero_grad()
    except RuntimeError as err:
        error = str(err)
    return {"same": same, "error": error, "findings": shim.findings()}


def record_stream_oom(policy):
    """torch's test_caching_allocator_record_stream_oom under the shim: 40 M
    floats allocated, used on a busy side stream, record_streamed and freed,
    100 times, with memory capped: the shim must wait for the pending
    blocks' events instead of failing.  Each use is queued behind a ~1 ms
    sleep on the side stream, so the host fills the cap long before the
    events fire (without it an H100 sometimes kept up and the out-of-memory
    path never ran)."""
    npu_lifetime.install("cuda", policy=policy)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        y = torch.zeros(40 * 1024 * 1024, device="cuda")
    _, total = torch.cuda.mem_get_info()
    torch.cuda.set_per_process_memory_fraction(min(1.0, (8 * 160 << 20) / total))  # room for ~7 of them
    failures = 0
    for _ in range(100):
        try:
            x = torch.empty(40 * 1024 * 1024, device="cuda")
        except torch.OutOfMemoryError:
            failures += 1
            continue
        with torch.cuda.stream(stream):
            torch.cuda._sleep(2_000_000)
            y += x
        x.record_stream(stream)
        del x
    torch.cuda.synchronize()
    stats = torch.cuda.memory_stats()
    torch.cuda.empty_cache()
    return {"failures": failures, "num_alloc_retries": stats["num_alloc_retries"],
            "num_sync_all_streams": stats["num_sync_all_streams"], "findings": [f["kind"] for f in shim.findings()]}


def memory_tools():
    """torch's memory functions under the shim: the keys and the meanings."""
    npu_lifetime.install("cuda")
    a = torch.empty(3 << 20, dtype=torch.uint8, device="cuda")
    stats = torch.cuda.memory_stats()
    allocated, peak = torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated()
    reserved = torch.cuda.memory_reserved()
    del a
    torch.cuda.reset_peak_memory_stats()
    after_reset = torch.cuda.max_memory_allocated()
    summary = torch.cuda.memory_summary()
    from npu_lifetime import memory

    return {"allocated": allocated, "peak": peak, "reserved": reserved, "after_reset": after_reset,
            "keys_present": all(k in stats for k in ("allocated_bytes.all.current", "active_bytes.all.peak",
                                                      "reserved_bytes.all.current", "num_alloc_retries", "num_ooms")),
            "summary_lines": len(summary.splitlines()),
            "ours_agree": memory.memory_reserved() == torch.cuda.memory_reserved(),
            "fraction": torch.cuda.get_per_process_memory_fraction()}


def debug_missing_handoff(debug):
    """A late reader on a side stream, x freed with no record_use: with
    debug mode the reader sees NaN every time (the poison), not x's data."""
    npu_lifetime.install("cuda", debug=(debug == "debug"))
    side = torch.cuda.Stream()
    warm = torch.ones(1 << 20, device="cuda")  # load every kernel first: a lazy module load synchronises
    with torch.cuda.stream(side):
        torch.cuda._sleep(1)
        warm.sum()
    torch.cuda.synchronize()
    del warm
    seen = []
    for _ in range(5):
        x = torch.ones(1 << 20, device="cuda")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.cuda._sleep(FIFTY_MIL_CYCLES)
            total = x.sum()  # the reader: queued late, nothing keeps x alive
        del x  # the missing hand-off
        torch.cuda.synchronize()
        seen.append(float(total))
    return {"seen": ["nan" if v != v else v for v in seen], "findings": [f["kind"] for f in shim.findings()],
            "poisoned": shim.stats()["quarantined.all.allocated"]}


PROGRAMS = {f.__name__: f for f in (hooks, graph_record_stream, graph_memory_is_not_clobbered, graphed_callables,
                                      reduce_overhead, record_stream_oom, memory_tools, debug_missing_handoff)}

if __name__ == "__main__":
    print(json.dumps(PROGRAMS[sys.argv[1]](*sys.argv[2:])))
