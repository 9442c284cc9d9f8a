"""The lifetime sanitizer's memory over a long clean loop: RSS (resident set
size, from /proc/self/statm) sampled every ``--every`` ops over ``--ops``
ops of a race-free, fully covered two-stream loop.  The sanitizer's memory
must be bounded by live storages, not by ops: RSS after warm-up stays flat.

    python benchmarks/bench_rss.py --device sim [--ops 1000000] [--every 100000]
    python benchmarks/bench_rss.py --device cuda
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import time


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


class CleanLoop:
    """Each step: the side stream computes from the last result, the compute
    stream waits and uses it, the side stream waits before its next step
    (so every cross-stream use is ordered and every free covered).  Four
    ops per step."""

    def __init__(self, device: str) -> None:
        import torch

        if device == "cuda":
            self.side, self.main = torch.cuda.Stream(), torch.cuda.current_stream()
            self.stream = torch.cuda.stream
            self.a = torch.ones(1024, device="cuda")
        else:
            from npu_lifetime import simdevice as sd

            self.side, self.main = sd.Stream(), sd.default_stream()
            self.stream = sd.stream
            self.a = torch.ones(1024)

    def step(self) -> None:
        self.side.wait_stream(self.main)
        with self.stream(self.side):
            b = self.a * 2
            c = b + 1
        self.main.wait_stream(self.side)
        d = c.relu()
        self.a = d - 1
        self.side.wait_stream(self.main)  # c, made on side, was last used on the compute stream


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="sim", choices=["sim", "cuda"])
    parser.add_argument("--ops", type=int, default=1_000_000)
    parser.add_argument("--every", type=int, default=100_000)
    parser.add_argument("--no-sanitizer", action="store_true", help="the same loop without the sanitizer")
    args = parser.parse_args()
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench_rss: no CUDA device here; run with --device sim on CPU")
    torch.set_num_threads(1)
    sanitizer = None
    if not args.no_sanitizer:
        from npu_lifetime.sanitizer import LifetimeSanitizer

        sanitizer = LifetimeSanitizer(args.device, on_race="raise").enable()
    loop = CleanLoop(args.device)
    ops_per_step = 4
    samples = []
    start = time.perf_counter()
    for step in range(args.ops // ops_per_step):
        loop.step()
        done = (step + 1) * ops_per_step
        if done % args.every == 0:
            gc.collect()
            samples.append((done, rss_mib()))
            print(f"{done:>9} ops  RSS {samples[-1][1]:8.1f} MiB  ({time.perf_counter() - start:.0f} s)", flush=True)
    if sanitizer is not None:
        sanitizer.disable()
        findings = sanitizer.flush()
        assert not sanitizer.failing(findings), sanitizer.report(findings)
        print(f"findings: {len(findings)} (live storages: {len(sanitizer.storages)}, "
              f"outstanding uses: {sanitizer.model.outstanding_uses()})")
    if len(samples) >= 2:
        first, last = samples[0], samples[-1]
        print(f"RSS from {first[0]} to {last[0]} ops: {first[1]:.1f} -> {last[1]:.1f} MiB "
              f"({last[1] - first[1]:+.1f} MiB), device {args.device}, "
              f"{'no sanitizer' if sanitizer is None else 'lifetime sanitizer'}")


if __name__ == "__main__":
    sys.exit(main())
