#!/usr/bin/env python3
"""How many of a sampled chain's samples sit in torch's GPU trace layer
outside any subscriber of ours (benchmarks/profile/sampler.c's stacks).

torch's trace interpreter methods (ConcretePyInterpreterVTable::trace_gpu_*)
are static in libtorch_python.so, so the stacks name them by offset only.
In torch 2.11.0+cu130's libtorch_python.so they lie in 0x775400-0x776300:
the frames there that are called straight from libc10_cuda.so (the caching
allocator, events, streams) and whose callee is the pybind call of
fire_callbacks (the symbolized profile names it); decref and dispatch, at
0x7765xx and 0x776937, are outside the range.  Another torch build needs
other offsets.  With the GPU trace bridge installed, its library
(libnpl_gpu_trace_bridge) is the trace layer instead.

    python3 trace_layer_share.py stacks_lifetime_3330272_h100.txt.gz
"""
import collections
import gzip
import sys

TRACE_METHODS = range(0x775400, 0x776300)
OURS = ("_trace_hook", "_event_hook", "_storage_feed", "_native_model", "_event_feed", "_host_lock", "_hook_relay")


def trace_entry(frames: list):
    """Index of the outermost frame in torch's trace methods or the bridge, or None."""
    for i, frame in enumerate(frames):
        if "libnpl_gpu_trace_bridge" in frame:
            return i
        if "libtorch_python.so@" in frame and int(frame.split("@")[1].split(":")[0], 16) in TRACE_METHODS:
            return i
    return None


for name in sys.argv[1:]:
    total, split = 0, collections.Counter()
    for line in gzip.open(name, "rt"):
        text, _, count = line.rstrip().rpartition(" ")
        frames, count = text.split(";"), int(count)
        total += count
        entry = trace_entry(frames)
        if entry is not None:
            below = frames[entry:]
            split["ours under the trace" if any(k in f for f in below for k in OURS) else "the trace layer only"] += count
    print(name, f"{total} samples:", ", ".join(f"{k} {v} ({100 * v / total:.1f}%)" for k, v in split.items()))
