#!/usr/bin/env python3
"""Where a fallback record_use of a new storage spends its time (issue 39:
at most 2x a raw event record), on a CUDA build: the same call timed with
one part taken away at a time, in interleaved rounds of one process.

    python3 benchmarks/profile/fallback_new_storage.py [--calls 20000] [--rounds 7]

Rows (microseconds per call, median over rounds):
- event_record: ``torch.cuda.Event.record`` on the side stream (the unit);
- one storage: the fallback re-recording one held storage;
- new storage, reaper on: the product (bench_record_use's row);
- new storage, reaper off: released between rounds, outside the timing;
- new storage, reaper off, gc off: the same with Python's collector off;
- untyped_storage() of a fresh tensor: the storage object's creation alone.
The fallback's counts (queries, events created) come with them.
"""
from __future__ import annotations

import argparse
import gc
import statistics
import time

import torch


def timed(fn, items) -> float:
    t0 = time.perf_counter()
    for item in items:
        fn(item)
    return (time.perf_counter() - t0) / len(items) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    from npu_lifetime.recording.torch_allocator_fallback import CaptureGate, CudaAPI, NativeFallback

    side, event = torch.cuda.Stream(), torch.cuda.Event()
    x = torch.ones(1024, device="cuda")
    reaped = NativeFallback(CudaAPI(), gate=CaptureGate())
    by_hand = NativeFallback(CudaAPI(), gate=CaptureGate(), background=False)
    rows: dict = {}

    def fresh():
        return [torch.ones(256, device="cuda") for _ in range(args.calls)]

    def add(name, us):
        rows.setdefault(name, []).append(us)

    for _ in range(args.rounds + 1):  # the first round warms up
        add("event_record", timed(lambda _: event.record(side), range(args.calls)))
        add("one storage", timed(lambda _: reaped.record(x, side), range(args.calls)))
        add("new storage, reaper on", timed(lambda t: reaped.record(t, side), fresh()))
        for gc_off in (False, True):
            tensors = fresh()
            if gc_off:
                gc.disable()
            add(f"new storage, reaper off{', gc off' if gc_off else ''}", timed(lambda t: by_hand.record(t, side),
                                                                             tensors))
            gc.enable()
            torch.cuda.synchronize()
            by_hand.reclaim()
        add("untyped_storage() of a fresh tensor", timed(lambda t: t.untyped_storage(), fresh()))
        torch.cuda.synchronize()
    unit = statistics.median(rows["event_record"][1:])
    print(f"per call, median of {args.rounds} rounds of {args.calls} (us; ratio to event_record)")
    for name, samples in rows.items():
        us = statistics.median(samples[1:])
        print(f"  {name:42s} {us:7.3f} us  {us / unit:5.2f}x")
    print("reaper on:", reaped.counts)
    print("reaper off:", by_hand.counts)
    reaped.stop_background()


if __name__ == "__main__":
    main()
