"""The FSDP-style hand-off on real CUDA streams with the shim: peak active
memory (live + waiting on events) and step time for record_stream, the
hand-rolled recipe, record_use under the poll and stream-wait policies, and
the recipe's over-reserving variant; plus the cost of one record_use call
against one event record.

    python benchmarks/bench_handoff.py [--width 2048] [--layers 8] [--steps 20] [--rounds 3]
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
RUNS = [("record_stream", "poll"), ("recipe", "poll"), ("record_use", "poll"), ("record_use", "stream_wait"),
        ("event_too_late", "poll")]


def child(width: int, layers: int, steps: int) -> None:
    import torch

    import npu_lifetime
    from npu_lifetime import shim
    from npu_lifetime.handoff import (BrokenEventTooLate, CudaHandoffDevice, RecipeHandoff, RecordStreamHandoff,
                                      RecordUseHandoff, run_handoff)

    classes = {"record_stream": RecordStreamHandoff, "recipe": RecipeHandoff, "record_use": RecordUseHandoff,
               "event_too_late": BrokenEventTooLate}
    npu_lifetime.install("cuda")
    device = CudaHandoffDevice()
    out = {}
    for name, policy in RUNS:
        shim.set_policy(policy)
        run_handoff(device, classes[name], layers=layers, width=width, steps=2, sanitize=False)  # warm-up
        r = run_handoff(device, classes[name], layers=layers, width=width, steps=steps, sanitize=False)
        out[f"{name}/{policy}"] = {"peak": r.peak_active_bytes, "steps": r.step_seconds}
    out["calls"] = call_costs(torch, npu_lifetime)
    print(json.dumps(out))


def call_costs(torch, npu_lifetime) -> dict:
    """Host cost of one record_use (shim path) and one event record, us."""
    side = torch.cuda.Stream()
    x = torch.ones(1024, device="cuda")
    event = torch.cuda.Event()
    n = 20000

    def per_call(fn) -> float:
        for _ in range(1000):
            fn()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t0) / n * 1e6

    costs = {"event_record_us": per_call(lambda: event.record(side)),
             "record_use_us": per_call(lambda: npu_lifetime.record_use(x, side)),
             "record_stream_us": per_call(lambda: x.record_stream(side))}
    torch.cuda.synchronize()
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.child:
        child(args.width, args.layers, args.steps)
        return
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore")
    samples: dict = {}
    calls: dict = {}
    for r in range(args.rounds):
        done = subprocess.run([sys.executable, __file__, "--child", "--width", str(args.width), "--layers",
                               str(args.layers), "--steps", str(args.steps)], capture_output=True, text=True,
                              env=env, cwd=ROOT)
        if done.returncode != 0:
            raise SystemExit(done.stderr[-3000:])
        result = json.loads(done.stdout.strip().splitlines()[-1])
        for key, value in result.pop("calls").items():
            calls.setdefault(key, []).append(value)
        for key, value in result.items():
            entry = samples.setdefault(key, {"peak": value["peak"], "steps": []})
            entry["steps"] += value["steps"]
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    recipe = statistics.median(samples["recipe/poll"]["steps"])
    mib = 1 << 20
    print(f"hand-off harness: {args.layers} layers, {args.width}x{args.width} fp32 buffers "
          f"({args.width * args.width * 4 / mib:.0f} MiB), medians of {args.rounds} x {args.steps} steps")
    print(f"{'hand-off/policy':<26} {'peak MiB':>9} {'step ms':>9} {'x recipe':>9}")
    for key, entry in samples.items():
        step = statistics.median(entry["steps"])
        print(f"{key:<26} {entry['peak'] / mib:>9.1f} {step * 1e3:>9.3f} {step / recipe:>9.3f}")
    for key, values in calls.items():
        print(f"{key:<26} {statistics.median(values):>9.2f} us per call")


if __name__ == "__main__":
    main()
