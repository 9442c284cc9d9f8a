"""Sanitizer overhead on a multi-stream workload: no sanitizer, CSAN
(torch.cuda._sanitizer), and npu_lifetime's lifetime sanitizer (also with
the allocator shim), each in its own process, rounds alternating.

The workload hands a chain of small tensors between three streams with
events (a few thousand ops per run), race-free and with every free covered,
so no variant reports anything.

    python benchmarks/bench_sanitizer.py [--rounds 3] [--steps 400] [--repeats 7]
    python benchmarks/bench_sanitizer.py --device sim   # CPU: simulated streams
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
VARIANTS_GPU = ("none", "csan", "lifetime", "lifetime+shim")
VARIANTS_SIM = ("none", "lifetime")


def workload(dev, steps: int) -> int:
    """Returns the number of ops it ran (counted on the first call)."""
    import torch

    streams = [dev.default_stream(), dev.Stream(), dev.Stream()]
    a = dev.randn(64)
    for i in range(steps):
        prod, cons = streams[i % 3], streams[(i + 1) % 3]
        with dev.stream(prod):
            b = a @ a
            c = b.relu()
            d = c + 1
            e = d * 0.5
            e.sum()
        cons.wait_stream(prod)
        with dev.stream(cons):
            a = torch.tanh(e * 0.1)
        prod.wait_stream(cons)  # e's last use, before prod may reuse its memory
    dev.synchronize()
    return steps * 7


def child(variant: str, device: str, steps: int, repeats: int) -> None:
    import torch

    sys.path.insert(0, str(ROOT / "tests"))
    from stream_devices import CudaDevice, SimDevice

    dev = CudaDevice if device == "cuda" else SimDevice
    dev.randn = (lambda n: torch.randn(n, n, device="cuda")) if device == "cuda" else (lambda n: torch.randn(n, n))
    if variant == "lifetime+shim":
        import npu_lifetime

        npu_lifetime.install("cuda")
    if variant == "csan":
        from torch.cuda._sanitizer import enable_cuda_sanitizer

        enable_cuda_sanitizer()
    sanitizer = None
    if variant.startswith("lifetime"):
        from npu_lifetime.sanitizer import LifetimeSanitizer

        sanitizer = LifetimeSanitizer(device, on_race="raise").enable()
    workload(dev, 20)  # warm-up: kernels, caches, streams
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        ops = workload(dev, steps)
        times.append(time.perf_counter() - t0)
    if sanitizer is not None:
        sanitizer.disable()
        findings = [f for f in sanitizer.flush() if not getattr(f, "live", False)]
        assert not findings, sanitizer.report(findings)
    print(json.dumps({"times": times, "ops": ops}))


def _device(parser: argparse.ArgumentParser, asked: "str | None") -> str:
    import torch

    if torch.cuda.is_available():
        return asked or "cuda"
    if asked == "cuda":
        parser.error("--device cuda needs a CUDA GPU and this machine has none; "
                     "--device sim runs the workload on simulated streams")
    if asked is None:
        print("no CUDA GPU here: running on the simulated device (CPU tensors on simulated streams; "
              "CSAN and the shim need CUDA and are left out)", file=sys.stderr)
    return "sim"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child")
    parser.add_argument("--device", choices=["cuda", "sim"], help="default: cuda where a GPU is, else sim")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.device, args.steps, args.repeats)
        return
    args.device = _device(parser, args.device)
    variants = VARIANTS_GPU if args.device == "cuda" else VARIANTS_SIM
    samples: dict = {v: [] for v in variants}
    ops = 0
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore")
    for r in range(args.rounds):
        for variant in variants if r % 2 == 0 else reversed(variants):
            done = subprocess.run(
                [sys.executable, __file__, "--child", variant, "--device", args.device,
                 "--steps", str(args.steps), "--repeats", str(args.repeats)],
                capture_output=True, text=True, env=env, cwd=ROOT,
            )
            if done.returncode != 0:
                raise SystemExit(f"{variant} failed:\n{done.stderr[-3000:]}")
            result = json.loads(done.stdout.strip().splitlines()[-1])
            samples[variant] += result["times"]
            ops = result["ops"]
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    base = statistics.median(samples["none"])
    print(f"workload: {ops} ops over 3 streams per run, device {args.device}; medians of "
          f"{args.rounds} rounds x {args.repeats} runs")
    print("columns: median milliseconds per workload run, microseconds per op, and time relative to no sanitizer "
          "(x none: 1.00 = no overhead)" + ("; sim ops are CPU tensor ops, not GPU launches" if args.device == "sim"
                                             else ""))
    print(f"{'variant':<15} {'ms/run':>9} {'us/op':>8} {'x none':>8}")
    for variant in variants:
        median = statistics.median(samples[variant])
        print(f"{variant:<15} {median * 1e3:>9.2f} {median / ops * 1e6:>8.2f} {median / base:>8.2f}")
    if "csan" in samples:
        ours = statistics.median(samples["lifetime"]) - base
        csan = statistics.median(samples["csan"]) - base
        print(f"lifetime overhead / CSAN overhead = {ours / csan:.2f} (below 1: the lifetime sanitizer adds less "
              "time than CSAN)")


if __name__ == "__main__":
    main()
