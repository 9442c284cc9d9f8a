"""Memory stranded by per-stream caching (vllm-project/vllm#52950's pattern):
each step a new ``torch.cuda.Stream`` allocates, fills and frees a large
buffer.  torch's allocator caches per (device, stream), so each stream's
freed buffer stays reserved for that stream alone, until torch's stream
pool wraps at 32 streams.

And a multi-stream pipeline: a copy stream brings each step's batch in,
two compute streams take the steps in turn (activations allocated and
freed on them), the batch handed off with record_use.  Per-stream caching
keeps each compute stream's activations reserved for it alone; reported:
the peak device memory in use (cudaMemGetInfo at each step's high point,
the same measure for every allocator) and the median step time.

Configurations, each in a process of its own: torch's allocator; torch's
``cudaMallocAsync`` backend; the shim; the shim with cross-stream reuse
(``NPU_LIFETIME_CROSS_STREAM_REUSE=1``).  Reported: device memory in use
(``cudaMemGetInfo``, above the start) after steps 1, 8, 32 and 40, and the
median step time (host, synchronised each step).

    python benchmarks/bench_cross_stream.py [--steps 40] [--mib 256] [--json F]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = {
    "torch": {},
    "cudaMallocAsync": {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"},
    "shim": {"NPL_BENCH_SHIM": "1"},
    "shim+cross_stream": {"NPL_BENCH_SHIM": "1", "NPU_LIFETIME_CROSS_STREAM_REUSE": "1"},
}
MARKS = (1, 8, 32, 40)


def worker(steps: int, mib: int) -> dict:
    import torch

    numel = (mib << 20) // 4
    torch.cuda.init()
    torch.cuda.synchronize()
    free0, _total = torch.cuda.mem_get_info()
    used, times = {}, []
    for step in range(1, steps + 1):
        start = time.perf_counter()
        stream = torch.cuda.Stream()  # a new stream each step (torch's pool hands out 32 in turn)
        with torch.cuda.stream(stream):
            buf = torch.empty(numel, device="cuda")
            buf.fill_(float(step))
            del buf
        stream.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
        if step in MARKS:
            free, _ = torch.cuda.mem_get_info()
            used[step] = (free0 - free) / (1 << 20)
    return {"used_mib": used, "step_ms": statistics.median(times[1:])}


def pipeline(steps: int, mib: int) -> dict:
    import torch

    import npu_lifetime

    numel = (mib << 20) // 4
    copy, compute = torch.cuda.Stream(), (torch.cuda.Stream(), torch.cuda.Stream())
    host = torch.ones(numel // 4).pin_memory()
    torch.cuda.synchronize()
    free0, _total = torch.cuda.mem_get_info()
    times, in_use = [], []
    for step in range(steps):
        start = time.perf_counter()
        with torch.cuda.stream(copy):
            batch = host.to("cuda", non_blocking=True)  # a quarter-size batch
        stream = compute[step % 2]
        stream.wait_stream(copy)
        with torch.cuda.stream(stream):
            acts = [torch.empty(numel, device="cuda") for _ in range(2)]
            for a in acts:
                a.fill_(1.0)
                a[: batch.numel()].add_(batch)
            in_use.append(free0 - torch.cuda.mem_get_info()[0])  # the step's high point: its memory is all held
            npu_lifetime.record_use(batch, stream)
            del acts
        del batch
        stream.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return {"peak_in_use_mib": max(in_use) / (1 << 20), "step_ms": statistics.median(times[1:])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--json")
    parser.add_argument("--worker", choices=("new_streams", "pipeline"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        if os.environ.get("NPL_BENCH_SHIM") == "1":
            import npu_lifetime

            npu_lifetime.install("cuda")
        run = worker if args.worker == "new_streams" else pipeline
        print(json.dumps(run(args.steps, args.mib)))
        return
    results, piped = {}, {}
    for name, env in CONFIGS.items():
        full = dict(os.environ, PYTHONPATH=str(ROOT), **env)
        for key in ("PYTORCH_CUDA_ALLOC_CONF", "NPU_LIFETIME_CROSS_STREAM_REUSE", "NPL_BENCH_SHIM"):
            if key not in env:
                full.pop(key, None)
        for pattern, into in (("new_streams", results), ("pipeline", piped)):
            done = subprocess.run([sys.executable, __file__, "--worker", pattern, "--steps", str(args.steps),
                                   "--mib", str(args.mib)], capture_output=True, text=True, env=full, timeout=600)
            if done.returncode != 0:
                print(f"{name} {pattern}: failed\n{done.stderr[-2000:]}", file=sys.stderr)
                continue
            into[name] = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"a new stream per step, {args.mib} MiB allocated, filled and freed on it; device memory in use above "
          "the start (MiB) after each step; median step ms")
    print(f"{'allocator':20}" + "".join(f"{'step ' + str(m):>10}" for m in MARKS) + f"{'step ms':>10}")
    for name, r in results.items():
        cells = "".join(f"{r['used_mib'].get(str(m), r['used_mib'].get(m, float('nan'))):10.0f}" for m in MARKS)
        print(f"{name:20}{cells}{r['step_ms']:10.3f}")
    print(f"\nthe pipeline: a copy stream, two compute streams in turn ({args.mib} MiB activations x2), record_use "
          "hand-offs; peak device memory in use above the start (cudaMemGetInfo at each step's high point), MiB; "
          "median step ms")
    for name, r in piped.items():
        print(f"{name:20}{r['peak_in_use_mib']:10.0f}{r['step_ms']:10.3f}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"new_streams": results, "pipeline": piped}, out, indent=2)


if __name__ == "__main__":
    main()
