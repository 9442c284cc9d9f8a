"""Graph-pool memory of a training iteration captured whole, with per-layer
buffers handed to a side stream (after NVIDIA/Megatron-LM#4383, where
record_stream under full-iteration capture took memory from about 110 GB to
about 190 GB).

Two patterns, each run eagerly (the reference) and captured into one graph
(``torch.cuda.graph``):

* ``simple``: 16 layers; each allocates a 64 MiB buffer on the compute
  stream, a side stream reads it, the compute stream joins the side stream
  at once and frees the buffer.
* ``1f1b``: Megatron's EP combined 1F1B overlap, two micro-batches' chunks
  interleaved per layer: chunk A's dispatch input goes to the communication
  stream's all-to-all, chunk B's backward work and combine all-to-all are
  issued, and only then is A's input released ("at the next real node");
  the compute stream then waits for A's dispatch (not for B's combine) to
  run A's experts, whose buffer could take A's released input.  What any
  allocator may safely reuse there: A's input once A's dispatch (its last
  reader) is ordered before the new owner, i.e. at A's expert buffer.  A
  record_stream marker taken at the free covers B's combine too, which the
  compute stream has not joined yet: that reuse is lost even with
  ``graph_capture_record_stream_reuse``.

Configurations, each in a process of its own: torch's allocator with
record_stream, with and without ``graph_capture_record_stream_reuse:True``;
the shim with record_stream, with and without that setting; the shim with
record_use (no setting).  Reported: the peak reserved memory above the
start, from an empty cache (as ``torch.cuda.graph`` begins): the graph
pool's size for the capture, one iteration's for eager; and the median
replay (or eager) step time.

    python benchmarks/bench_capture_memory.py [--layers 16] [--mib 64] [--replays 20] [--json F]
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
CONFIGS = {
    "torch+record_stream": ("torch", "record_stream", False),
    "torch+record_stream+setting": ("torch", "record_stream", True),
    "shim+record_stream": ("shim", "record_stream", False),
    "shim+record_stream+setting": ("shim", "record_stream", True),
    "shim+record_use": ("shim", "record_use", False),
}
PATTERNS = ("simple", "1f1b")
SETTING = "graph_capture_record_stream_reuse:True"


def _record(how, t, stream):
    if how == "record_use":
        import npu_lifetime

        npu_lifetime.record_use(t, stream)
    else:
        t.record_stream(stream)


def simple(layers, numel, side, how):
    import torch

    compute = torch.cuda.current_stream()
    out = torch.zeros(layers, device="cuda")
    for i in range(layers):
        buf = torch.full((numel,), float(i), device="cuda")
        side.wait_stream(compute)
        with torch.cuda.stream(side):
            out[i] = buf[:1024].sum()  # the side stream reads it
            _record(how, buf, side)
        compute.wait_stream(side)  # joined back at once
        del buf  # freed on the compute stream
    return out


def one_f_one_b(layers, numel, comm, how):
    import torch

    compute = torch.cuda.current_stream()
    out = torch.zeros(layers, device="cuda")
    for i in range(layers):
        a_input = torch.full((numel,), float(i), device="cuda")  # chunk A's attention output
        comm.wait_stream(compute)
        with torch.cuda.stream(comm):
            a_dispatched = a_input[:1024] * 1  # A's dispatch all-to-all reads it
            if how == "record_use":
                _record(how, a_input, comm)  # right after its last use
            a_done = torch.cuda.Event()
            a_done.record()
        b_input = torch.full((numel // 4,), 1.0, device="cuda")  # chunk B's backward work (overlapped)
        comm.wait_stream(compute)
        with torch.cuda.stream(comm):
            b_combined = b_input[:1024] * 2  # B's combine all-to-all
        if how == "record_stream":
            a_input.record_stream(comm)
        del a_input  # released at the next real node: after B's combine was issued
        compute.wait_event(a_done)  # A's experts need A's dispatch, not B's combine
        experts = torch.full((numel,), 2.0, device="cuda")  # A's expert buffer: may take A's input
        out[i] = experts[:1024].sum() + a_dispatched.sum()
        del experts
        compute.wait_stream(comm)  # the layer's end: B's combine rejoins
        out[i] += b_combined.sum()
        b_input.record_stream(comm) if how == "record_stream" else _record(how, b_input, comm)
        del b_input, a_dispatched, b_combined
    return out


def worker(config: str, pattern: str, layers: int, mib: int, replays: int) -> dict:
    allocator, how, _setting = CONFIGS[config]
    if allocator == "shim":
        import npu_lifetime

        npu_lifetime.install("cuda")
    import torch

    run = simple if pattern == "simple" else one_f_one_b
    numel = (mib << 20) // 4
    side = torch.cuda.Stream()
    result = {}
    for mode in ("eager", "captured"):
        if mode == "eager":
            run(layers, numel, side, how)  # warm-up, as before a capture
        # torch.cuda.graph empties the cache as it begins: both modes start from an empty cache
        import gc

        torch.cuda.synchronize()
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_reserved()
        if mode == "eager":
            run(layers, numel, side, how)
            step = lambda: run(layers, numel, side, how)  # noqa: E731
        else:
            graph = torch.cuda.CUDAGraph()
            capture_stream = torch.cuda.Stream()
            capture_stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(capture_stream):
                with torch.cuda.graph(graph, stream=capture_stream):
                    run(layers, numel, side, how)
            torch.cuda.current_stream().wait_stream(capture_stream)
            step = graph.replay
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_reserved() - base
        times = []
        for _ in range(replays):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        result[mode] = {"peak_mib": peak / (1 << 20), "step_ms": statistics.median(times)}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument("--json")
    parser.add_argument("--worker", nargs=2, metavar=("CONFIG", "PATTERN"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(*args.worker, args.layers, args.mib, args.replays)))
        return
    import torch

    if not torch.cuda.is_available():
        sys.exit("bench_capture_memory: needs a CUDA GPU")
    results = {}
    for pattern in PATTERNS:
        for config, (_allocator, _how, setting) in CONFIGS.items():
            env = dict(os.environ, PYTHONPATH=str(ROOT))
            env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
            if setting:
                env["PYTORCH_CUDA_ALLOC_CONF"] = SETTING
            done = subprocess.run([sys.executable, __file__, "--worker", config, pattern, "--layers", str(args.layers),
                                   "--mib", str(args.mib), "--replays", str(args.replays)],
                                  capture_output=True, text=True, env=env, timeout=600)
            if done.returncode != 0:
                results[(pattern, config)] = {"error": done.stderr.strip().splitlines()[-1:]}
                print(f"{pattern} {config}: failed: {done.stderr[-2000:]}", file=sys.stderr)
                continue
            results[(pattern, config)] = json.loads(done.stdout.strip().splitlines()[-1])
            print(f"done {pattern} {config}", file=sys.stderr, flush=True)
    print(f"{args.layers} layers, {args.mib} MiB buffers; peak = reserved memory above an empty cache "
          "(captured: the graph pool; eager: one iteration)")
    print(f"{'pattern':8} {'configuration':30} {'eager MiB':>10} {'captured MiB':>13} {'x eager':>8} "
          f"{'eager ms':>9} {'replay ms':>10}")
    for (pattern, config), r in results.items():
        if "error" in r:
            print(f"{pattern:8} {config:30} failed: {r['error']}")
            continue
        e, c = r["eager"], r["captured"]
        ratio = c["peak_mib"] / e["peak_mib"] if e["peak_mib"] else float("nan")
        print(f"{pattern:8} {config:30} {e['peak_mib']:10.0f} {c['peak_mib']:13.0f} {ratio:8.2f} "
              f"{e['step_ms']:9.3f} {c['step_ms']:10.3f}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({f"{p}/{c}": r for (p, c), r in results.items()}, out, indent=2)


if __name__ == "__main__":
    main()
