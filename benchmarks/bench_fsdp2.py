"""FSDP2's step time, as shipped (the hand-rolled recipe) and migrated to
record_use, under the shim and under torch's own allocator, in one run:
the ratio record_use / recipe per timing round (the two modes alternate
within each launch of examples/fsdp2_record_use.py), its median and spread
over rounds, launches and ranks, per allocator.  Launches of the two
allocators alternate too.  Needs 2 GPUs (NCCL); with --device cpu it runs
over gloo on the CPU (the figures then say nothing about GPUs).

    python benchmarks/bench_fsdp2.py [--launches 3] [--rounds 4] [--steps 20] [--device cuda|cpu]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ALLOCATORS = ("shim", "native")


def launch(allocator: str, args) -> list:
    """One torchrun launch of the timing phase; each rank's per-round step
    medians for the recipe and record_use."""
    with tempfile.TemporaryDirectory() as out:
        env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore", NCCL_NVLS_ENABLE="0",
                   TORCH_SYMM_MEM_DISABLE_MULTICAST="1")
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                   str(ROOT / "examples" / "fsdp2_record_use.py"), "--device", args.device, "--allocator", allocator,
                   "--phases", "timing", "--rounds", str(args.rounds), "--steps", str(args.steps), "--json", out]
        if args.width:
            command += ["--width", str(args.width)]
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=args.timeout)
        if done.returncode != 0:
            sys.exit(f"bench_fsdp2: the {allocator} launch failed:\n{done.stderr[-4000:]}")
        return [json.loads((Path(out) / f"rank{r}.json").read_text())["timing"] for r in (0, 1)]


def ratios(timings: list) -> list:
    """record_use / recipe for each round of each rank (round r of both modes ran back to back)."""
    out = []
    for timing in timings:
        pairs = zip(timing["record_use"]["round_step_ms"], timing["recipe"]["round_step_ms"], strict=True)
        out += [use / recipe for use, recipe in pairs]
    return out


def describe(values: list) -> str:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    spread = f"IQR {q[0]:.3f}-{q[2]:.3f}  range {min(values):.3f}-{max(values):.3f}"
    return f"median {statistics.median(values):.3f}  {spread}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--launches", type=int, default=3, help="launches per allocator (alternating)")
    parser.add_argument("--rounds", type=int, default=4, help="timing rounds per launch")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per round")
    parser.add_argument("--width", type=int, default=0, help="model width (default: the example's)")
    parser.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args(argv)
    if args.device == "cuda":
        import torch

        if torch.cuda.device_count() < 2:
            print(f"bench_fsdp2: needs 2 CUDA GPUs (found {torch.cuda.device_count()}); --device cpu runs over gloo",
                  file=sys.stderr)
            return 2
    per_allocator = {a: [] for a in ALLOCATORS}
    medians = {a: {"recipe": [], "record_use": []} for a in ALLOCATORS}
    for i in range(args.launches):
        for allocator in (ALLOCATORS if i % 2 == 0 else ALLOCATORS[::-1]):
            timings = launch(allocator, args)
            per_allocator[allocator] += ratios(timings)
            for timing in timings:
                for mode in ("recipe", "record_use"):
                    medians[allocator][mode] += timing[mode]["round_step_ms"]
            print(f"launch {i + 1}/{args.launches} {allocator}: done", file=sys.stderr, flush=True)
    print(f"FSDP2 step time, device {args.device}: {args.launches} launches x {args.rounds} rounds x 2 ranks per "
          f"allocator, {args.steps} steps per round")
    print("columns: per-round median step ms of each mode; ratio = record_use / recipe of the same round")
    for allocator in ALLOCATORS:
        ms = medians[allocator]
        print(f"{allocator:<7} recipe {statistics.median(ms['recipe']):8.2f} ms  record_use "
              f"{statistics.median(ms['record_use']):8.2f} ms  ratio {describe(per_allocator[allocator])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
