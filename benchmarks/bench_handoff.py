"""The FSDP-style hand-off with the shim: peak active memory (live +
waiting on events) and step time for record_stream, the hand-rolled recipe,
record_use under the shim's default policy and each explicit one, and the
recipe's over-reserving variant.  (The cost of one record_use call:
benchmarks/bench_record_use.py.)

    python benchmarks/bench_handoff.py [--device auto|cuda|sim] [--width 2048] [--layers 8] [--steps 20] [--rounds 3]

On a machine without CUDA (or with --device sim) it runs on the simulated
device: peak memory is the shim's on its simulated runtime, where the
consumer's lag is scripted; step times are host times only.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
def runs(default_policy: str) -> list:
    """(hand-off, policy) pairs: record_use under the default policy and
    each explicit one; the others under poll, as FSDP2 users run today."""
    from npu_lifetime import shim

    pairs = [("record_stream", "poll"), ("recipe", "poll"), ("record_use", default_policy)]
    pairs += [("record_use", p) for p in shim.POLICIES if p != default_policy]
    return pairs + [("event_too_late", "poll")]


def measure(device, width: int, layers: int, steps: int, reset) -> dict:
    from npu_lifetime import shim
    from npu_lifetime.handoff import (BrokenEventTooLate, RecipeHandoff, RecordStreamHandoff, RecordUseHandoff,
                                      run_handoff)

    classes = {"record_stream": RecordStreamHandoff, "recipe": RecipeHandoff, "record_use": RecordUseHandoff,
               "event_too_late": BrokenEventTooLate}
    out = {}
    for name, policy in runs(shim.policy()):
        reset()
        shim.set_policy(policy)
        run_handoff(device, classes[name], layers=layers, width=width, steps=2, sanitize=False)  # warm-up
        r = run_handoff(device, classes[name], layers=layers, width=width, steps=steps, sanitize=False)
        out[f"{name}/{policy}"] = {"peak": r.peak_active_bytes, "steps": r.step_seconds}
    return out


def child(width: int, layers: int, steps: int) -> None:
    import npu_lifetime
    from npu_lifetime.handoff import CudaHandoffDevice

    npu_lifetime.install("cuda")  # the default policy
    print(json.dumps(measure(CudaHandoffDevice(), width, layers, steps, reset=lambda: None)))


def simulated(width: int, layers: int, steps: int) -> dict:
    from npu_lifetime import shim
    from npu_lifetime.handoff import SimHandoffDevice

    device = SimHandoffDevice()
    default_policy = shim.policy()

    def reset() -> None:
        shim.reset()
        shim.select_runtime("sim")
        shim.set_policy(default_policy)

    return measure(device, width, layers, steps, reset)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--device", default="auto", choices=["auto", "cuda", "sim"])
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    for name in ('width', 'layers', 'steps', 'rounds'):  # each a count: 0 or less measures nothing
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, not {getattr(args, name)}")
    if args.child:
        child(args.width, args.layers, args.steps)
        return
    import torch

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "sim"
    elif device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda needs a CUDA GPU and this machine has none; use --device sim")
    if device == "sim":
        print("no CUDA device: the simulated device (peak from the shim's simulated runtime, scripted consumer "
              "lag; step times are host times)" if args.device == "auto" else "the simulated device")
        if args.width > 512:  # host memory and host time: the pattern, not the size, is what the sim shows
            print(f"--width {args.width} is more than the simulated device needs: 64 used")
            args.width = 64
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore")
    samples: dict = {}
    for r in range(args.rounds):
        if device == "sim":
            result = simulated(args.width, args.layers, args.steps)
            for key, value in result.items():
                entry = samples.setdefault(key, {"peak": value["peak"], "steps": []})
                entry["steps"] += value["steps"]
            continue
        done = subprocess.run([sys.executable, __file__, "--child", "--width", str(args.width), "--layers",
                               str(args.layers), "--steps", str(args.steps)], capture_output=True, text=True,
                              env=env, cwd=ROOT)
        if done.returncode != 0:
            raise SystemExit(done.stderr[-3000:])
        result = json.loads(done.stdout.strip().splitlines()[-1])
        for key, value in result.items():
            entry = samples.setdefault(key, {"peak": value["peak"], "steps": []})
            entry["steps"] += value["steps"]
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    recipe = statistics.median(samples["recipe/poll"]["steps"])
    unit, scale = ("MiB", 1 << 20) if device == "cuda" else ("KiB", 1 << 10)
    print(f"hand-off harness on {device}: {args.layers} layers, {args.width}x{args.width} fp32 buffers "
          f"({args.width * args.width * 4 / scale:.1f} {unit}), medians of {args.rounds} x {args.steps} steps")
    print(f"  peak {unit}: the shim's peak active memory (live + freed but waiting on events); step ms: median step, "
          "device synchronised; x recipe: step time over the recipe's")
    print(f"{'hand-off/policy':<26} {'peak ' + unit:>9} {'step ms':>9} {'x recipe':>9}")
    for key, entry in samples.items():
        step = statistics.median(entry["steps"])
        print(f"{key:<26} {entry['peak'] / scale:>9.1f} {step * 1e3:>9.3f} {step / recipe:>9.3f}")


if __name__ == "__main__":
    main()
