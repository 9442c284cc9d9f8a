"""Allocation cost: the shim against PyTorch's native caching allocator.

1. ``torch.empty(n, device="cuda")`` + ``del`` of a cached size, timed in
   child processes (the allocator is chosen per process): native, shim, and
   shim in debug mode (poison + quarantine).  Each round runs one child per
   variant side by side, each pinned to its own physical core, rotating the
   variants over the cores from round to round; the ratio to native is taken
   within each round (same machine state) and its median over rounds is
   quoted, raw and normalised by each process's own CPU ``torch.empty``
   (per-process times on the device host were bimodal, 2.1 or 4.1 us for
   the same program).  Needs a GPU.
2. ``Tensor.record_stream`` per call, same children: native, the shim
   through torch's record_stream hook (now), and the shim through a Python
   override of ``aten::record_stream`` (the route before the hook was wired).
3. ns per ``npl_alloc`` + ``npl_free`` pair called from C
   (allocator_shim/bench/bench_pairs.cpp), on the simulated runtime and,
   when present, the CUDA runtime; and on the simulated runtime with a
   block pending throughout (every allocation polls events), captures not
   announced (a capture-status query per allocation) and announced (none,
   as under install("cuda"): design D19).

   With --instructions, also instructions per pair (valgrind's callgrind).

    python benchmarks/bench_shim_alloc.py [--rounds 5] [--iters 20000] [--repeats 11] [--instructions]
        [--json PATH]

With --json, every number printed is also written to PATH as one JSON object
(torch.empty table per size and variant, C pairs per runtime and size, the
100 ns goal for the CUDA pair).
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


def _dispatch_reference(iters: int) -> float:
    """us per ``torch.empty(1024)`` + ``del`` on the CPU: the same Python
    and dispatcher path as the timed loop with the host allocator under it,
    the yardstick that divides out how fast this process's core runs."""
    import torch

    t0 = time.perf_counter()
    for _ in range(iters):
        t = torch.empty(1024)
        del t
    return (time.perf_counter() - t0) / iters * 1e6


def child(allocator: str, iters: int, repeats: int, core: int | None) -> None:
    import torch

    if core is not None:
        os.sched_setaffinity(0, {core})
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
        _dispatch_reference(1000)
    out: dict = {size: [] for size in SIZES}
    out["reference"] = []
    for _ in range(repeats):  # sizes interleaved: no size pays for going first
        for size in SIZES:
            out[size].append(loop(size // 4, count))
        out["reference"].append(_dispatch_reference(iters))
    record_stream_cost(1000, 2)  # warm-up
    out["record_stream"] = record_stream_cost(iters, repeats)
    print(json.dumps(out))


def _distinct_cores(n: int) -> list:
    """Up to n CPUs of distinct physical cores (no two SMT siblings), not CPU 0."""
    cores, seen = [], set()
    for cpu in sorted(os.sched_getaffinity(0)):
        try:
            siblings = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list").read_text().strip()
        except OSError:
            siblings = str(cpu)
        if siblings not in seen:
            seen.add(siblings)
            cores.append(cpu)
    return cores[1:n + 1] if len(cores) > n else cores[:n]


def _start_child(allocator: str, core: int | None, iters: int, repeats: int) -> subprocess.Popen:
    cmd = [sys.executable, __file__, "--child", allocator, "--iters", str(iters), "--repeats", str(repeats)]
    if core is not None:
        cmd += ["--core", str(core)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))


def _child_result(allocator: str, proc: subprocess.Popen) -> dict:
    stdout, stderr = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"the {allocator} child failed:\n{stderr[-3000:]}")
    values = json.loads(stdout.strip().splitlines()[-1])
    return {k if k in ("record_stream", "reference") else int(k): v for k, v in values.items()}


def _run_round(order: tuple, cores: list, iters: int, repeats: int) -> dict:
    """One child per variant: side by side on distinct cores when there are
    enough (every variant of a round then meets the same machine state),
    else one after another."""
    if len(cores) >= len(order):
        procs = [(a, _start_child(a, cores[i], iters, repeats)) for i, a in enumerate(order)]
        return {a: _child_result(a, p) for a, p in procs}
    return {a: _child_result(a, _start_child(a, None, iters, repeats)) for a in order}


def child_table(rounds: int, iters: int, repeats: int) -> dict:
    """Medians per variant and key, and per-round ratios to native: raw, and
    normalised by each process's own dispatch reference."""
    keys = [*SIZES, "record_stream"]
    cores = _distinct_cores(len(VARIANTS))
    runs = []
    for r in range(rounds):
        order = VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]  # rotate variants over the cores
        runs.append(_run_round(order, cores, iters, repeats))
        print(f"round {r + 1}/{rounds} done", file=sys.stderr)
    med = statistics.median
    table = {key: {a: med([v for run in runs for v in run[a][key]]) for a in VARIANTS} for key in keys}
    table["reference"] = {a: med([v for run in runs for v in run[a]["reference"]]) for a in VARIANTS}
    for key in keys:
        for a in VARIANTS[1:]:
            raw = [med(run[a][key]) / med(run["native"][key]) for run in runs]
            norm = [(med(run[a][key]) / med(run[a]["reference"]))
                    / (med(run["native"][key]) / med(run["native"]["reference"])) for run in runs]
            table[key][a + "/native"] = (med(raw), min(raw), max(raw))
            table[key][a + "/native normalised"] = (med(norm), min(norm), max(norm))
    table["side_by_side"] = len(cores) >= len(VARIANTS)
    return table


def _build_bench_pairs(tmp: str) -> Path | None:
    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        return None
    exe = Path(tmp) / "bench_pairs"
    subprocess.run([cxx, "-std=c++17", "-O2", str(ROOT / "allocator_shim/bench/bench_pairs.cpp"), "-o", str(exe),
                    "-ldl"], check=True)
    return exe


def _shim_library() -> str:
    sys.path.insert(0, str(ROOT))
    from npu_lifetime.shim import library_path

    return str(library_path())


def c_pairs(runtime: str, size: int, mode: str = "plain") -> dict | None:
    with tempfile.TemporaryDirectory() as tmp:
        exe = _build_bench_pairs(tmp)
        if exe is None:
            return None
        done = subprocess.run([str(exe), _shim_library(), runtime, str(size), "1000000", "9", mode],
                              capture_output=True, text=True)
    if done.returncode != 0:
        print(f"bench_pairs {runtime}: {done.stderr.strip()}", file=sys.stderr)
        return None
    return json.loads(done.stdout)


def c_pair_instructions(size: int, mode: str = "plain") -> int | None:
    """Instructions per pair on the simulated runtime, counted by callgrind:
    the difference between runs of 200k and 100k pairs (start-up cancels).
    A count is what a noisy machine cannot blur."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        return None
    totals = []
    with tempfile.TemporaryDirectory() as tmp:
        exe = _build_bench_pairs(tmp)
        for pairs in (100_000, 200_000):
            out = Path(tmp) / f"callgrind.{pairs}"
            subprocess.run([valgrind, "--tool=callgrind", f"--callgrind-out-file={out}", str(exe), _shim_library(),
                            "sim", str(size), str(pairs), "1", mode], check=True, capture_output=True)
            summary = [line for line in out.read_text().splitlines() if line.startswith(("summary:", "totals:"))]
            totals.append(int(summary[0].split()[1]))
    return (totals[1] - totals[0]) // 100_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", choices=VARIANTS)
    parser.add_argument("--core", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--skip-torch", action="store_true", help="only the C-level pairs")
    parser.add_argument("--instructions", action="store_true",
                        help="also count instructions per C-level pair with valgrind's callgrind")
    parser.add_argument("--json", metavar="PATH", help="also write the results to PATH as JSON")
    args = parser.parse_args()
    for name in ('rounds', 'iters', 'repeats'):  # each a count: 0 or less measures nothing
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, not {getattr(args, name)}")
    if args.child:
        child(args.child, args.iters, args.repeats, args.core)
        return
    import torch

    results = {"torch": torch.__version__, "cuda": torch.cuda.is_available(), "torch_empty": None, "c_pairs": {},
               "instructions": {}}
    if not args.skip_torch and torch.cuda.is_available():
        table = child_table(args.rounds, args.iters, args.repeats)
        results["device"] = torch.cuda.get_device_name()
        results["torch_empty"] = {str(key): value for key, value in table.items()}
        how = "side by side on distinct cores" if table["side_by_side"] else "one after another"
        print(f"torch.empty + del, cached, {torch.cuda.get_device_name()}, torch {torch.__version__}: "
              f"{args.rounds} rounds, the variants of a round {how}")
        print("  us per op (medians over all repeats); ratio to native: median of the per-round ratios "
              "[lowest, highest]; normalised: each process's time divided by its own CPU torch.empty(1024) first")
        print(f"{'bytes':>10} {'native':>8} {'shim':>8} {'debug':>8}   {'shim/native':<24} {'normalised':<24} "
              f"{'debug/native':>12}")
        for size in SIZES:
            m = table[size]
            raw, norm, dbg = m["shim/native"], m["shim/native normalised"], m["shim_debug/native"]
            print(f"{size:>10} {m['native']:>8.3f} {m['shim']:>8.3f} {m['shim_debug']:>8.3f}   "
                  f"{raw[0]:.3f} [{raw[1]:.3f}, {raw[2]:.3f}]{'':<4} {norm[0]:.3f} [{norm[1]:.3f}, {norm[2]:.3f}]"
                  f"{'':<4} {dbg[0]:>8.2f}")
        ref = table["reference"]
        print("  CPU torch.empty(1024) + del in the same processes (us): "
              + ", ".join(f"{a} {ref[a]:.3f}" for a in VARIANTS))
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
            results["c_pairs"][f"{runtime} {size}"] = r
            if r is not None:
                print(f"  {runtime:>4} {size:>8} bytes: {r['median_ns']:8.1f} ns/pair "
                      f"(repeats {min(r['repeats_ns']):.1f}..{max(r['repeats_ns']):.1f})")
    print("  with a block pending throughout (sim): capture status asked per allocation vs captures announced")
    for size in (4096, 1 << 20):
        for mode in ("pending", "pending_announced"):
            r = c_pairs("sim", size, mode)
            results["c_pairs"][f"sim {size} {mode}"] = r
            if r is not None:
                print(f"   sim {size:>8} bytes {mode:<17}: {r['median_ns']:8.1f} ns/pair "
                      f"(repeats {min(r['repeats_ns']):.1f}..{max(r['repeats_ns']):.1f})")
    if args.instructions:
        for size in (4096, 1 << 20):
            for mode in ("plain", "pending", "pending_announced"):
                count = c_pair_instructions(size, mode)
                results["instructions"][f"{size} {mode}"] = count
                print(f"  sim {size:>8} bytes {mode:<17}: {count} instructions/pair (callgrind)" if count is not None
                      else "  instructions per pair: valgrind not found")

    cuda_pairs = [r["median_ns"] for key, r in results["c_pairs"].items() if key.startswith("cuda ") and r]
    results["cuda_pair_at_most_100ns"] = all(ns <= 100 for ns in cuda_pairs) if cuda_pairs else None
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
