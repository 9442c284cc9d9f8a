"""Cost of the lifetime model per event (pure Python, no torch).

Runs a steady multi-stream workload (alloc, cross-stream reads and writes
with waits, record_use, free) through LifetimeModel and reports the median
microseconds per access over several repeats, plus the cost of the other
event kinds.  Usage: python benchmarks/bench_model.py [--streams 4] [--repeats 7]
[--model python|native] (native: the same model in C++, lifetime.NativeLifetimeModel)
"""
from __future__ import annotations

import argparse
import statistics
import time

from npu_lifetime import lifetime
from npu_lifetime.lifetime import LifetimeModel


def _workload(model: LifetimeModel, streams: int, rounds: int) -> dict:
    """Returns seconds spent per event kind (summed over the round)."""
    spent = {"access": 0.0, "wait": 0.0, "record_use": 0.0, "alloc+free": 0.0}
    counts = dict.fromkeys(spent, 0)
    clock = time.perf_counter
    for r in range(rounds):
        producer, consumer = r % streams, (r + 1) % streams
        t0 = clock()
        model.allocate(r, producer, address=r % 64 * 4096, size=4096)
        spent["alloc+free"] += clock() - t0
        t0 = clock()
        for _ in range(8):
            model.write(r, producer, op="aten::add_")
        spent["access"] += clock() - t0
        t0 = clock()
        model.wait_stream(consumer, producer)
        spent["wait"] += clock() - t0
        t0 = clock()
        for _ in range(8):
            model.read(r, consumer, op="aten::mm")
        spent["access"] += clock() - t0
        t0 = clock()
        model.record_use(r, consumer)
        spent["record_use"] += clock() - t0
        t0 = clock()
        model.free(r)
        spent["alloc+free"] += clock() - t0
        counts["access"] += 16
        counts["wait"] += 1
        counts["record_use"] += 1
        counts["alloc+free"] += 1
    return {k: spent[k] / counts[k] * 1e6 for k in spent}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--model", default="python", choices=["python", "native"],
                        help="python: lifetime.LifetimeModel (default); native: lifetime.NativeLifetimeModel")
    args = parser.parse_args()
    model_class = LifetimeModel if args.model == "python" else lifetime.NativeLifetimeModel
    if model_class is None:
        parser.error("--model native: the native lifetime model is not built (pip install -e . with a C++ compiler)")
    for name in ('streams', 'rounds', 'repeats'):  # each a count: 0 or less measures nothing
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, not {getattr(args, name)}")
    runs = []
    for _ in range(args.repeats):
        model = model_class()
        for s in range(args.streams):
            model.create_stream(s)
        runs.append(_workload(model, args.streams, args.rounds))
        assert not model.findings, model.findings[:3]
    print(f"lifetime model ({args.model}), {args.streams} streams, {args.rounds} rounds x {args.repeats} repeats")
    print("columns: microseconds spent in the model per event of that kind, median / min / max over the repeats")
    print(f"{'event':<12} {'median us':>10} {'min us':>8} {'max us':>8}")
    for kind in runs[0]:
        values = [run[kind] for run in runs]
        print(f"{kind:<12} {statistics.median(values):>10.2f} {min(values):>8.2f} {max(values):>8.2f}")


if __name__ == "__main__":
    main()
