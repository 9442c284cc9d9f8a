"""Allocation cost: the shim against PyTorch's native caching allocator.

1. ``torch.empty(n, device="cuda")`` + ``del`` of a cached size, timed in
   child processes (the allocator is chosen per process): native, shim, and
   shim in debug mode (poison + quarantine), alternating, several rounds;
   medians of per-op microseconds and their ratio to native.  Needs a GPU.
2. ``Tensor.record_stream`` per call, same children: native, the shim
   through torch's record_stream hook (now), and the shim through a Python
   override of ``aten::record_stream`` (the route before the hook was wired).
3. ns per ``npl_alloc`` + ``npl_free`` pair called from C
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


VARIANTS = ("native", "shim", "shim_debug", "shim_python_override")


def _python_record_stream_override() -> None:
    """The previous route of Tensor.record_stream to the shim: a Python
    kernel for aten::record_stream (kept here only to measure it)."""
    import torch

    from npu_lifetime.shim import api

    def record_stream(tensor, stream):
        api.record_stream(tensor.untyped_storage().data_ptr(), torch.cuda.Stream(
            stream_id=stream.stream_id, device_index=stream.device_index, device_type=stream.device_type).cuda_stream)

    lib = torch.library.Library("aten", "IMPL")
    lib.impl("record_stream", record_stream, "CUDA")
    _python_record_stream_override.lib = lib  # keep it registered


def record_stream_cost(iters: int, repeats: int) -> list:
    import torch

    side = torch.cuda.Stream()
    x = torch.empty(1024, device="cuda")
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            x.record_stream(side)
        out.append((time.perf_counter() - t0) / iters * 1e6)
    return out


def child(allocator: str, iters: int, repeats: int) -> None:
    import torch

    # one core for every child: per-process timings of torch.empty on the
    # device machine were bimodal (2.1 or 4.1 us) with the scheduler free to move them
    if hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) > 2:
        os.sched_setaffinity(0, {2})

    if allocator != "native":
        import npu_lifetime

        npu_lifetime.install("cuda", debug=allocator == "shim_debug")
        if allocator == "shim_python_override":
            _python_record_stream_override()
    torch.cuda.init()

    def loop(n: int, count: int) -> float:
        t0 = time.perf_counter()
        for _ in range(count):
            t = torch.empty(n, device="cuda")
            del t
        return (time.perf_counter() - t0) / count * 1e6

    # debug mode fills every freed block and copies it back when it leaves the
    # quarantine: far slower per op, so fewer ops (the median per op is what counts)
    count = max(200, iters // 50) if allocator == "shim_debug" else iters
    warm_until = time.perf_counter() + 1.0  # module loads, caches, clocks
    while time.perf_counter() < warm_until:
        for size in SIZES:
            loop(size // 4, min(1000, count))
    out: dict = {size: [] for size in SIZES}
    for _ in range(repeats):  # sizes interleaved: no size pays for going first
        for size in SIZES:
            out[size].append(loop(size // 4, count))
    record_stream_cost(1000, 2)  # warm-up
    out["record_stream"] = record_stream_cost(iters, repeats)
    print(json.dumps(out))


def child_table(rounds: int, iters: int, repeats: int) -> dict:
    keys = [*SIZES, "record_stream"]
    samples = {(a, k): [] for a in VARIANTS for k in keys}
    per_process: dict = {a: [] for a in VARIANTS}
    for r in range(rounds):
        order = VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]  # rotate who goes first
        for allocator in order:
            done = subprocess.run(
                [sys.executable, __file__, "--child", allocator, "--iters", str(iters), "--repeats", str(repeats)],
                capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
            )
            if done.returncode != 0:
                raise SystemExit(f"the {allocator} child failed:\n{done.stderr[-3000:]}")
            for key, values in json.loads(done.stdout.strip().splitlines()[-1]).items():
                samples[(allocator, key if key == "record_stream" else int(key))] += values
                if key == str(SIZES[0]):
                    per_process[allocator].append(statistics.median(values))
        print(f"round {r + 1}/{rounds} done", file=sys.stderr)
    spread = {a: (min(per_process[a]), max(per_process[a])) for a in VARIANTS}
    print("  per-process medians of the 4 KiB case (us), lowest..highest: "
          + "; ".join(f"{a} {lo:.2f}..{hi:.2f}" for a, (lo, hi) in spread.items()), file=sys.stderr)
    return {key: {a: statistics.median(samples[(a, key)]) for a in VARIANTS} for key in keys}


def c_pairs(runtime: str, size: int) -> dict | None:
    sys.path.insert(0, str(ROOT))
    from npu_lifetime.shim import library_path

    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "bench_pairs"
        subprocess.run([cxx, "-std=c++17", "-O2", str(ROOT / "allocator_shim/bench/bench_pairs.cpp"), "-o", str(exe),
                        "-ldl"],
                       check=True)
        done = subprocess.run([str(exe), str(library_path()), runtime, str(size), "1000000", "9"],
                              capture_output=True, text=True)
    if done.returncode != 0:
        print(f"bench_pairs {runtime}: {done.stderr.strip()}", file=sys.stderr)
        return None
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", choices=VARIANTS)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--skip-torch", action="store_true", help="only the C-level pairs")
    args = parser.parse_args()
    for name in ('rounds', 'iters', 'repeats'):  # each a count: 0 or less measures nothing
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, not {getattr(args, name)}")
    if args.child:
        child(args.child, args.iters, args.repeats)
        return
    import torch

    if not args.skip_torch and torch.cuda.is_available():
        table = child_table(args.rounds, args.iters, args.repeats)
        print(f"torch.empty + del, cached (medians, us per op), {torch.cuda.get_device_name()}, "
              f"torch {torch.__version__}")
        print("  columns: native caching allocator, the shim, the shim in debug mode; ratios to native")
        print(f"{'bytes':>10} {'native':>9} {'shim':>9} {'debug':>9} {'shim/nat':>9} {'debug/nat':>10}")
        for size in SIZES:
            m = table[size]
            print(f"{size:>10} {m['native']:>9.3f} {m['shim']:>9.3f} {m['shim_debug']:>9.3f} "
                  f"{m['shim'] / m['native']:>9.3f} {m['shim_debug'] / m['native']:>10.3f}")
        rs = table["record_stream"]
        print("Tensor.record_stream per call (medians, us): native "
              f"{rs['native']:.3f}; shim via torch's hook (now) {rs['shim']:.3f}; "
              f"shim via a Python aten override (before) {rs['shim_python_override']:.3f}")
    elif not args.skip_torch:
        print("torch.empty + del: skipped (no CUDA GPU)")
    print("npl_alloc + npl_free pair from C (median of 9 x 1e6 pairs): nanoseconds per pair, per runtime "
          "(sim = host memory; cuda only where a GPU is present)")
    runtimes = ("sim", "cuda") if not args.skip_torch and torch.cuda.is_available() else ("sim",)
    for runtime in runtimes:
        for size in (4096, 1 << 20):
            r = c_pairs(runtime, size)
            if r is not None:
                print(f"  {runtime:>4} {size:>8} bytes: {r['median_ns']:8.1f} ns/pair")


if __name__ == "__main__":
    main()
