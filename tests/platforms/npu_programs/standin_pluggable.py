"""torch_npu's pluggable-allocator API on the stand-in runtime: a small C
allocator (built by the test, over aclrtMalloc/aclrtFree) serves every
allocation. Prints one JSON line.

    python tests/platforms/npu_programs/standin_pluggable.py LIBRARY.so
"""
import ctypes
import json
import sys

import torch
import torch_npu  # noqa: F401


def counter(lib: ctypes.CDLL, name: str) -> int:
    return ctypes.c_uint64.in_dll(lib, name).value


def main(path: str) -> dict:
    allocator = torch.npu.memory.NPUPluggableAllocator(path, "test_alloc", "test_free")
    torch.npu.memory.change_current_allocator(allocator)
    lib = ctypes.CDLL(path)
    x = torch.ones(1000, device="npu")
    t = x + 1  # every operand stays alive until its work ran (see the README on task-queue frees)
    y = t * 3
    values = y.cpu()[:3].tolist()
    allocs = counter(lib, "test_allocs")
    del x, t, y
    torch.npu.synchronize()
    return {"values": values, "allocs": allocs, "frees": counter(lib, "test_frees"),
            "bytes_allocated": counter(lib, "test_bytes")}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
