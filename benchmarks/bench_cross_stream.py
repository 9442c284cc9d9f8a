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
``cudaMallocAsync`` backend; the shim with cross-stream reuse off (torch's
per-stream caching, ``NPU_LIFETIME_CROSS_STREAM_REUSE=off``), idle (the
default: only segments no stream still uses move, with no GPU-side wait)
and always (segments move behind GPU-side waits).  Reported: device memory in use
(``cudaMemGetInfo``, above the start) after steps 1, 8, 32 and 40, and the
median step time (host, synchronised each step).

Each pattern runs ``--rounds`` times per configuration, the configurations
interleaved in a rotating order (a slow moment of the machine then falls on
every configuration alike); the step time quoted is the median of the
rounds' medians, with the rounds' range beside it.

    python benchmarks/bench_cross_stream.py [--steps 40] [--pipeline-steps 200] [--rounds 3] [--mib 256] [--json F]
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
    "shim off": {"NPL_BENCH_SHIM": "1", "NPU_LIFETIME_CROSS_STREAM_REUSE": "off"},
    "shim idle (default)": {"NPL_BENCH_SHIM": "1"},
    "shim always": {"NPL_BENCH_SHIM": "1", "NPU_LIFETIME_CROSS_STREAM_REUSE": "always"},
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


def _run(name: str, pattern: str, steps: int, mib: int):
    """One process of ``pattern`` under configuration ``name``: its result, or None if it failed."""
    env = CONFIGS[name]
    full = dict(os.environ, PYTHONPATH=str(ROOT), **env)
    for key in ("PYTORCH_CUDA_ALLOC_CONF", "NPU_LIFETIME_CROSS_STREAM_REUSE", "NPL_BENCH_SHIM"):
        if key not in env:
            full.pop(key, None)
    done = subprocess.run([sys.executable, __file__, "--worker", pattern, "--steps", str(steps), "--mib", str(mib)],
                          capture_output=True, text=True, env=full, timeout=600)
    if done.returncode != 0:
        print(f"{name} {pattern}: failed\n{done.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def _rounds(rounds: list, key: str) -> dict:
    """The first round's figures, with ``key`` the median over the rounds and its range, and
    the highest peak."""
    values = [r[key] for r in rounds]
    out = {**rounds[0], key: statistics.median(values), f"{key}_range": (min(values), max(values)),
           "rounds": len(rounds)}
    if "peak_in_use_mib" in rounds[0]:  # the highest of the rounds' peaks
        out["peak_in_use_mib"] = max(r["peak_in_use_mib"] for r in rounds)
    return out


def paired_to_torch(runs: dict) -> dict:
    """{configuration: the median over rounds of its step time over
    torch's allocator's in the same round} (rounds where both ran)."""
    torch_rounds = runs.get("torch", [])
    return {name: statistics.median(r["step_ms"] / t["step_ms"] for r, t in zip(rounds, torch_rounds))
            for name, rounds in runs.items() if rounds and torch_rounds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40, help="steps of the new-stream pattern")
    parser.add_argument("--pipeline-steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pipeline-rounds", type=int, help="rounds of the pipeline (default: --rounds); the "
                        "rounds past --rounds run the pipeline only")
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
    pipeline_rounds = args.rounds if args.pipeline_rounds is None else args.pipeline_rounds
    if min(args.steps, args.pipeline_steps, args.rounds, pipeline_rounds, args.mib) < 1:
        parser.error("--steps, --pipeline-steps, --rounds, --pipeline-rounds and --mib must be at least 1")
    runs = {"new_streams": {}, "pipeline": {}}
    names = list(CONFIGS)
    for round_ in range(max(args.rounds, pipeline_rounds)):
        patterns = [("new_streams", args.steps)] if round_ < args.rounds else []
        patterns += [("pipeline", args.pipeline_steps)] if round_ < pipeline_rounds else []
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:
            for pattern, steps in patterns:
                got = _run(name, pattern, steps, args.mib)
                if got is not None:
                    runs[pattern].setdefault(name, []).append(got)
    results = {name: _rounds(r, "step_ms") for name, r in runs["new_streams"].items()}
    piped = {name: _rounds(r, "step_ms") for name, r in runs["pipeline"].items()}
    print(f"a new stream per step, {args.mib} MiB allocated, filled and freed on it; device memory in use above "
          "the start (MiB) after each step; median step ms")
    print(f"{'allocator':20}" + "".join(f"{'step ' + str(m):>10}" for m in MARKS) + f"{'step ms':>10}")
    for name, r in results.items():
        cells = "".join(f"{r['used_mib'].get(str(m), r['used_mib'].get(m, float('nan'))):10.0f}" for m in MARKS)
        print(f"{name:20}{cells}{r['step_ms']:10.3f}  ({r['step_ms_range'][0]:.3f}-{r['step_ms_range'][1]:.3f})")
    print(f"\nthe pipeline: a copy stream, two compute streams in turn ({args.mib} MiB activations x2), record_use "
          "hand-offs; peak device memory in use above the start (cudaMemGetInfo at each step's high point), MiB; "
          "median step ms")
    paired = paired_to_torch(runs["pipeline"])
    print("(last column: the median over rounds of the step over torch's allocator's step of the same round)")
    for name, r in piped.items():
        r["step_vs_torch_paired"] = paired.get(name)
        vs = "" if name not in paired else f"  {paired[name]:.3f}x torch"
        print(f"{name:20}{r['peak_in_use_mib']:10.0f}{r['step_ms']:10.3f}  ({r['step_ms_range'][0]:.3f}-"
              f"{r['step_ms_range'][1]:.3f}){vs}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"new_streams": results, "pipeline": piped}, out, indent=2)


if __name__ == "__main__":
    main()
