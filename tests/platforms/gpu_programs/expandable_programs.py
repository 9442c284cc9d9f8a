"""Expandable segments on a real GPU, each program run under the shim
("shim") or under torch's own allocator ("native", the control), both
turned on the way users do: torch.cuda.memory._set_allocator_settings or
PYTORCH_CUDA_ALLOC_CONF.  Each prints one JSON line.

    python tests/platforms/gpu_programs/expandable_programs.py PROGRAM ALLOCATOR
"""
import ctypes
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

import npu_lifetime
from npu_lifetime import shim

# A MemPool's own allocator, as torch's test_mempool_expandable makes one:
# plain cudaMalloc/cudaFree, resolved from the libcudart torch loaded.
DUMMY_ALLOCATOR = r"""
#include <dlfcn.h>
#include <stddef.h>
typedef int (*malloc_fn)(void**, size_t);
typedef int (*free_fn)(void*);
static void* cudart(void) {
    const char* names[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"};
    for (unsigned i = 0; i < sizeof names / sizeof *names; ++i) {
        void* h = dlopen(names[i], RTLD_NOW | RTLD_NOLOAD);
        if (h) return h;
    }
    return dlopen("libcudart.so", RTLD_NOW);
}
int dummy_allocs = 0;
void* dummy_alloc(size_t size, int device, void* stream) {
    (void)device; (void)stream;
    void* p = 0;
    malloc_fn f = (malloc_fn)dlsym(cudart(), "cudaMalloc");
    if (f == 0 || f(&p, size) != 0) return 0;
    dummy_allocs++;
    return p;
}
void dummy_free(void* p, size_t size, int device, void* stream) {
    (void)size; (void)device; (void)stream;
    free_fn f = (free_fn)dlsym(cudart(), "cudaFree");
    if (f) f(p);
}
"""


def setup(allocator: str) -> dict:
    if allocator == "shim":
        installed = npu_lifetime.install("cuda")
        return {"backend": torch.cuda.get_allocator_backend(), "hooks": list(installed.hooks)}
    return {"backend": torch.cuda.get_allocator_backend(), "hooks": []}


def dummy_allocator():
    out = Path(tempfile.mkdtemp()) / "dummy_allocator.so"
    src = out.with_suffix(".c")
    src.write_text(DUMMY_ALLOCATOR)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(out), str(src), "-ldl"], check=True)
    return torch.cuda.memory.CUDAPluggableAllocator(str(out), "dummy_alloc", "dummy_free"), ctypes.CDLL(str(out))


def findings(allocator: str) -> list:
    return [f["kind"] for f in shim.findings()] if allocator == "shim" else []


def mempool_expandable(allocator):
    """torch's test_mempool_expandable: an allocation inside use_mem_pool of a
    pool with its own allocator gets a plain segment, the next eager one an
    expandable segment; exactly two segments, one expandable."""
    info = setup(allocator)
    torch.cuda.empty_cache()
    torch.cuda.memory._set_allocator_settings("expandable_segments:True")
    custom, lib = dummy_allocator()
    pool = torch.cuda.MemPool(custom.allocator())
    nelem = 1024 * 1024 // 4
    data = []
    with torch.cuda.use_mem_pool(pool):
        data.append(torch.empty(nelem, device="cuda"))
    data.append(torch.empty(nelem, device="cuda"))
    segments = torch.cuda.memory.memory_snapshot()
    torch.cuda.memory._set_allocator_settings("expandable_segments:False")
    return dict(info, segments=len(segments), expandable=sum(bool(s["is_expandable"]) for s in segments),
                dummy_allocs=ctypes.c_int.in_dll(lib, "dummy_allocs").value, findings=findings(allocator))


def growth(allocator):
    """Tensors of one stream grow one segment in place; contents survive the
    growth; empty_cache gives the free pages at the end back."""
    info = setup(allocator)
    torch.cuda.memory._set_allocator_settings("expandable_segments:True")
    mb = 1 << 20
    first = torch.full((15 * mb // 4,), 7.0, device="cuda")
    more = [torch.empty(10 * mb // 4, device="cuda") for _ in range(6)]
    in_place = all(more[0].data_ptr() == first.data_ptr() + 15 * mb and
                   b.data_ptr() == a.data_ptr() + 10 * mb for a, b in zip(more, more[1:]))
    for t in more:
        t.fill_(1.0)
    torch.cuda.synchronize()
    intact = bool((first == 7.0).all().item())
    # the large pool's: the bool result of the check above grows a small-pool one too, under both allocators
    expandable = [s for s in torch.cuda.memory_snapshot() if s["is_expandable"] and s["segment_type"] == "large"]
    reserved_full = torch.cuda.memory_reserved()
    del more
    torch.cuda.empty_cache()
    reserved_after = torch.cuda.memory_reserved()
    still = bool((first == 7.0).all().item())
    torch.cuda.memory._set_allocator_settings("expandable_segments:False")
    return dict(info, in_place=in_place, intact=intact and still, expandable_segments=len(expandable),
                reserved_full=reserved_full, reserved_after=reserved_after, findings=findings(allocator))


def record_stream_then_empty_cache(allocator):
    """A block another stream still reads is not unmapped by empty_cache
    before that stream is done (torch waits on its events first)."""
    info = setup(allocator)
    torch.cuda.memory._set_allocator_settings("expandable_segments:True")
    side = torch.cuda.Stream()
    keep = torch.ones(4 << 20, device="cuda")
    x = torch.full((32 << 20,), 3.0, device="cuda")  # past the first page
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)
        total = x.sum()
    x.record_stream(side)
    del x
    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    ok = abs(total.item() - 3.0 * (32 << 20)) < 1e3
    torch.cuda.memory._set_allocator_settings("expandable_segments:False")
    del keep
    return dict(info, sum_ok=ok, findings=findings(allocator))


if __name__ == "__main__":
    print(json.dumps(globals()[sys.argv[1]](*sys.argv[2:])))
