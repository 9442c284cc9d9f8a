"""Allocation cost: the shim against PyTorch's native caching allocator.

1. ``torch.empty(n, device="cuda")`` + ``del`` of a cached size, timed in
   child processes (the allocator is chosen per process), native and shim
   alternating, several rounds; medians of per-op microseconds and their
   ratio.  Needs a CUDA GPU.
2. ns per ``npl_alloc`` + ``npl_free`` pair called from C
   (allocator_shim/bench/bench_pairs.cpp), on the simulated runtime and,
   when present, the CUDA runtime.

    python benchmarks/bench_shim_alloc.py [--rounds 5] [--iters 20000] [--repeats 11]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SIZES = (4096, 1 << 20, 16 << 20)


def child(allocator: str, iters: int, repeats: int) -> None:
    import torch

    if allocator == "shim":
        import npu_lifetime

        npu_lifetime.install("cuda")
    torch.cuda.init()

    def loop(n: int, count: int) -> float:
        t0 = time.perf_counter()
        for _ in range(count):
            t = torch.empty(n, device="cuda")
            del t
        return (time.perf_counter() - t0) / count * 1e6

    warm_until = time.perf_counter() + 1.0  # module loads, caches, clocks
    while time.perf_counter() < warm_until:
        for size in SIZES:
            loop(size // 4, 1000)
    out: dict = {size: [] for size in SIZES}
    for _ in range(repeats):  # sizes interleaved: no size pays for going first
        for size in SIZES:
            out[size].append(loop(size // 4, iters))
    print(json.dumps(out))


def torch_empty_table(rounds: int, iters: int, repeats: int) -> list:
    samples = {(a, s): [] for a in ("native", "shim") for s in SIZES}
    for r in range(rounds):
        order = ("native", "shim") if r % 2 == 0 else ("shim", "native")
        for allocator in order:
            done = subprocess.run(
                [sys.executable, __file__, "--child", allocator, "--iters", str(iters), "--repeats", str(repeats)],
                capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
            )
            if done.returncode != 0:
                raise SystemExit(f"the {allocator} child failed:\n{done.stderr[-3000:]}")
            for size, values in json.loads(done.stdout.strip().splitlines()[-1]).items():
                samples[(allocator, int(size))] += values
        print(f"round {r + 1}/{rounds} done", file=sys.stderr)
    rows = []
    for size in SIZES:
        native = statistics.median(samples[("native", size)])
        shim = statistics.median(samples[("shim", size)])
        rows.append((size, native, shim, shim / native))
    return rows


def c_pairs(runtime: str, size: int) -> dict | None:
    sys.path.insert(0, str(ROOT))
    from npu_lifetime.shim import library_path

    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "bench_pairs"
        subprocess.run([cxx, "-std=c++17", "-O2", str(ROOT / "allocator_shim/bench/bench_pairs.cpp"), "-o", str(exe), "-ldl"],
                       check=True)
        done = subprocess.run([str(exe), str(library_path()), runtime, str(size), "1000000", "9"],
                              capture_output=True, text=True)
    if done.returncode != 0:
        print(f"bench_pairs {runtime}: {done.stderr.strip()}", file=sys.stderr)
        return None
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", choices=["native", "shim"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--skip-torch", action="store_true", help="only the C-level pairs")
    args = parser.parse_args()
    if args.child:
        child(args.child, args.iters, args.repeats)
        return
    import torch

    if not args.skip_torch and torch.cuda.is_available():
        print(f"torch.empty + del, cached, {torch.cuda.get_device_name()}, torch {torch.__version__}")
        print("columns: median microseconds per torch.empty + del of a cached size under torch's native caching "
              "allocator and under the shim; shim/native: their ratio (1.0 = same cost)")
        print(f"{'bytes':>10} {'native us':>10} {'shim us':>10} {'shim/native':>12}")
        for size, native, shim, ratio in torch_empty_table(args.rounds, args.iters, args.repeats):
            print(f"{size:>10} {native:>10.3f} {shim:>10.3f} {ratio:>12.3f}")
    elif not args.skip_torch:
        print("torch.empty + del: skipped (no CUDA GPU)")
    print("npl_alloc + npl_free pair from C (median of 9 x 1e6 pairs): nanoseconds per pair, per runtime "
          "(sim = host memory; cuda only where a GPU is present)")
    for runtime in ("sim", "cuda"):
        for size in (4096, 1 << 20):
            r = c_pairs(runtime, size)
            if r is not None:
                print(f"  {runtime:>4} {size:>8} bytes: {r['median_ns']:8.1f} ns/pair")


if __name__ == "__main__":
    main()
