"""Programs that need a fresh process on a CUDA machine: the allocator can
only be swapped before CUDA allocates anything.  Each prints one JSON line.

    python tests/platforms/gpu_programs/shim_programs.py PROGRAM [ARGS...]
"""
import json
import sys

import torch

import npu_lifetime
from npu_lifetime import shim

SLEEP_CYCLES = 1_000_000_000  # ~0.5 s of GPU time: the side stream runs late, far behind the host
N = 1 << 20  # 4 MiB of float32


POLICIES = {"shim": "poll", "shim_stream_wait": "stream_wait", "shim_lazy_wait": "lazy_wait"}


def install(allocator):
    if allocator in POLICIES:
        npu_lifetime.install("cuda", policy=POLICIES[allocator])


def basic():
    install("shim")
    a = torch.randn(512, 512, device="cuda")
    b = (a @ a).cpu()
    ref = a.cpu().double() @ a.cpu().double()
    rel = float((b.double() - ref).norm() / ref.norm())
    ptrs = set()
    for _ in range(100):
        t = torch.empty(1000, device="cuda")
        ptrs.add(t.data_ptr())
        del t
    s = shim.stats()
    return {"rel_error": rel, "distinct_ptrs": len(ptrs), "allocations": s["allocation.all.allocated"],
            "cache_hits": s["cache_hits"], "runtime": shim.runtime_name(), "findings": shim.findings()}


def warm_up_kernels():
    """Loads every kernel the handoff uses: with lazy module loading, a
    kernel's first launch may wait for the device, hiding the race."""
    x = torch.ones(16, device="cuda")
    torch.cuda._sleep(1)
    (x * 2).fill_(7.0)
    bool((x == 2).all())
    x.sum()  # the reduction the sanitizer programs use on their side streams
    npu_lifetime.record_use(x, torch.cuda.current_stream())  # first calls pay for imports
    torch.cuda.synchronize()


def handoff(allocator, mode):
    """x is read on a late side stream, then freed; a new tensor of the same
    size is written on the default stream.  Did the side stream's read see
    x's data?"""
    install(allocator)
    warm_up_kernels()
    default = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    x = torch.ones(N, device="cuda")
    x_ptr = x.data_ptr()
    side.wait_stream(default)
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP_CYCLES)
        y = x * 2
    if mode == "record_stream":
        x.record_stream(side)
    elif mode == "record_use":
        npu_lifetime.record_use(x, side)
    del x
    z = torch.empty(N, device="cuda")
    z.fill_(7.0)
    reused = z.data_ptr() == x_ptr
    torch.cuda.synchronize()
    return {"corrupted": not bool((y == 2).all()), "reused": reused,
            "findings": shim.findings() if allocator != "native" else []}


def record_stream_reaches_shim():
    install("shim")
    side = torch.cuda.Stream()
    x = torch.ones(N, device="cuda")
    x[10:].record_stream(side)  # through a view: the storage's base is recorded
    blocks = [b for seg in shim.snapshot()["segments"] for b in seg["blocks"] if b["address"] == x.data_ptr()]
    return {"recorded": blocks[0]["recorded_streams"], "side": side.cuda_stream}


def late_install():
    torch.zeros(1, device="cuda")
    try:
        npu_lifetime.install("cuda")
    except RuntimeError as err:
        return {"error": type(err).__name__, "message": str(err)}
    return {"error": None}


def out_of_memory(policy):
    """A request larger than the GPU: torch.OutOfMemoryError, then the
    program goes on allocating; the C-level call returns NULL and a finding."""
    npu_lifetime.install("cuda", policy=policy)
    free, total = torch.cuda.mem_get_info()
    ok = torch.empty(1024, device="cuda")
    try:
        torch.empty(total // 2 * 3, dtype=torch.uint8, device="cuda")
        error = None
    except torch.OutOfMemoryError as err:
        error = str(err)
    again = torch.ones(1 << 20, device="cuda")
    p = shim.alloc(total * 4, 0, torch.cuda.current_stream().cuda_stream)
    stats = torch.cuda.memory_stats()
    return {"error": error, "again_ok": float(again.sum()) == float(1 << 20), "ptr": p,
            "findings": [f["kind"] for f in shim.findings()], "num_ooms": stats["num_ooms"],
            "tensor_still_fine": float(ok.fill_(1).sum()) == 1024.0,
            "bridge": npu_lifetime.shim.install.installed().bridge}


PROGRAMS = {f.__name__: f for f in (basic, handoff, record_stream_reaches_shim, late_install, out_of_memory)}

if __name__ == "__main__":
    print(json.dumps(PROGRAMS[sys.argv[1]](*sys.argv[2:])))
