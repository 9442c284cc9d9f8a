"""Host cost of one record_use call, against a raw event record and
record_stream, measured in the same run (interleaved rounds, medians).

    python benchmarks/bench_record_use.py [--device auto|cuda|sim|fallback] [--calls 20000] [--rounds 7]

cuda: one child process with the shim installed (the fast path; the goal is
<= 2 us and <= 2x a raw torch.cuda.Event.record), one with the native
caching allocator (the fallback; the goal is <= 3 us per call, for one
storage re-recorded and for a new storage each call).  sim: the same fast
path on CPU tensors over the shim's simulated runtime, simdevice streams:
the Python overhead only, there is no device call behind it.  fallback:
NativeFallback.record itself over a fake device API whose event record and
query are no-ops (its reaper thread running): the fallback's own Python
overhead, what a CPU machine can measure of the GPU cost (which adds the
event record and the fast path's checks).
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


def per_call_us(fns: dict, calls: int, rounds: int) -> dict:
    """{name: median over rounds of the per-call time}, rounds interleaved
    so that drift hits every function alike."""
    samples = {name: [] for name in fns}
    for fn in fns.values():
        for _ in range(min(calls, 1000)):
            fn()  # warm-up
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            samples[name].append((time.perf_counter() - t0) / calls * 1e6)
    return {name: statistics.median(v) for name, v in samples.items()}


def cuda_shim(calls: int, rounds: int) -> dict:
    import npu_lifetime

    npu_lifetime.install("cuda")  # the default policy
    import torch

    from npu_lifetime import recording, shim

    side = torch.cuda.Stream()
    x = torch.ones(1024, device="cuda")
    event = torch.cuda.Event()
    npu_lifetime.record_use(x, side)  # enables the fast path
    lib, ptr, handle = shim.native.library(), x.data_ptr(), side.cuda_stream

    def current_stream_call():
        with torch.cuda.stream(side):
            npu_lifetime.record_use(x)

    def event_in_stream_context():
        with torch.cuda.stream(side):
            event.record()

    out = per_call_us({
        "event_record": lambda: event.record(side),
        "record_use": lambda: npu_lifetime.record_use(x, side),
        "recording.record_use": lambda: recording.record_use(x, side),
        "npl_record_use (ctypes only)": lambda: lib.npl_record_use(ptr, handle),
        "record_stream": lambda: x.record_stream(side),
        "record_use, current stream (in a stream context)": current_stream_call,
        "event_record, current stream (in a stream context)": event_in_stream_context,
    }, calls, rounds)
    torch.cuda.synchronize()
    return {"allocator": f"shim ({shim.policy()})", "us": out}


def cuda_native(calls: int, rounds: int) -> dict:
    import torch

    import npu_lifetime
    from npu_lifetime.recording.native_fallback import FALLBACK

    side = torch.cuda.Stream()
    x = torch.ones(1024, device="cuda")
    event = torch.cuda.Event()
    fresh = [torch.ones(256, device="cuda") for _ in range(calls)]
    position = [0]

    def new_storage():  # a storage the fallback holds nothing for yet (FSDP's all-gather outputs)
        i = position[0] = (position[0] + 1) % calls
        npu_lifetime.record_use(fresh[i], side)

    out = per_call_us({
        "event_record": lambda: event.record(side),
        "record_use (fallback), one storage": lambda: npu_lifetime.record_use(x, side),
        "record_use (fallback), a new storage each call": new_storage,
        "record_stream": lambda: x.record_stream(side),
    }, calls, rounds)
    torch.cuda.synchronize()
    return {"allocator": "native", "us": out, "fallback": dict(FALLBACK.for_device("cuda").counts)}


def fallback_fake(calls: int, rounds: int) -> dict:
    """NativeFallback.record over a fake device API: no device call behind
    it.  Timed in the calling thread's CPU time (this is pure Python work;
    on a shared machine wall time would mostly measure the neighbours):
    one storage re-recorded, and a new storage each call (the storages
    are made, and released after, outside the timing)."""
    import statistics
    import time

    import torch

    from npu_lifetime.recording.native_fallback import CaptureGate, NativeFallback

    class Stream:
        def __init__(self, handle):
            self.handle, self.device_index = handle, 0

    class Event:
        def record(self, stream):
            pass

    class FakeAPI:
        fired = False  # nothing fires while timed: every entry stays held
        query = staticmethod(lambda event: FakeAPI.fired)
        new_event, handle = Event, staticmethod(lambda stream: stream.handle)
        device_index = staticmethod(lambda stream: stream.device_index)
        is_capturing = staticmethod(lambda: False)
        record_event = staticmethod(lambda event, stream: None)
        # one segment holding every address, allocated on stream 1 (the uses are on stream 2)
        segments = staticmethod(lambda: [{"address": 0, "total_size": 1 << 62, "device": 0, "stream": 1}])
        segment_version = staticmethod(lambda device: (0, 0))

    fallback = NativeFallback(FakeAPI(), gate=CaptureGate())
    side, event, x = Stream(2), Event(), torch.ones(4)
    samples = {"event_record": [], "NativeFallback.record, one storage": [],
               "NativeFallback.record, a new storage each call": []}
    for _ in range(rounds + 1):  # the first round warms up
        fresh = [torch.ones(4) for _ in range(calls)]
        t0 = time.thread_time()
        for _ in range(calls):
            event.record(side)
        t1 = time.thread_time()
        for _ in range(calls):
            fallback.record(x, side)
        t2 = time.thread_time()
        for t in fresh:
            fallback.record(t, side)
        t3 = time.thread_time()
        for name, seconds in zip(samples, (t1 - t0, t2 - t1, t3 - t2), strict=True):
            samples[name].append(seconds / calls * 1e6)
        FakeAPI.fired = True
        fallback.reclaim()
        FakeAPI.fired = False
    fallback.stop_background()
    out = {name: statistics.median(v[1:]) for name, v in samples.items()}
    return {"allocator": "none: the fallback over a fake device API (Python overhead only, thread CPU time)",
            "us": out, "fallback": fallback.counts}


def sim(calls: int, rounds: int) -> dict:
    import npu_lifetime
    from npu_lifetime import recording, shim, simdevice
    from npu_lifetime.handoff import SimHandoffDevice

    device = SimHandoffDevice()
    side = simdevice.Stream()
    x = device.empty(1024, simdevice.default_stream())
    event = simdevice.Event()
    lib, ptr, handle = shim.native.library(), x.data_ptr(), device.handle(side)
    with recording.shim_route(device.route):
        npu_lifetime.record_use(x, side)

        def current_stream_call():
            with simdevice.stream(side):
                npu_lifetime.record_use(x)

        def event_in_stream_context():
            with simdevice.stream(side):
                event.record()

        out = per_call_us({
            "simdevice event_record": lambda: event.record(side),
            "record_use": lambda: npu_lifetime.record_use(x, side),
            "recording.record_use": lambda: recording.record_use(x, side),
            "npl_record_use (ctypes only)": lambda: lib.npl_record_use(ptr, handle),
            "record_use, current stream (in a stream context)": current_stream_call,
            "event_record, current stream (in a stream context)": event_in_stream_context,
        }, calls, rounds)
    return {"allocator": f"shim on its simulated runtime ({shim.policy()})", "us": out}


CHILDREN = {"cuda_shim": cuda_shim, "cuda_native": cuda_native}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto", choices=["auto", "cuda", "sim", "fallback"])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--child", choices=sorted(CHILDREN))
    args = parser.parse_args()
    for name in ('calls', 'rounds'):  # each a count: 0 or less measures nothing
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, not {getattr(args, name)}")
    if args.child:
        print(json.dumps(CHILDREN[args.child](args.calls, args.rounds)))
        return
    import torch

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "sim"
        if device == "sim":
            print("no CUDA device here: measuring on the simulated device (Python overhead only)")
    elif device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda needs a CUDA GPU and this machine has none; use --device sim")
    if device == "sim":
        results = [sim(args.calls, args.rounds)]
    elif device == "fallback":
        results = [fallback_fake(args.calls, args.rounds)]
    else:
        env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore")
        results = []
        for child in ("cuda_shim", "cuda_native"):
            done = subprocess.run([sys.executable, __file__, "--child", child, "--calls", str(args.calls),
                                   "--rounds", str(args.rounds)], capture_output=True, text=True, env=env, cwd=ROOT)
            if done.returncode != 0:
                raise SystemExit(f"{child} failed:\n{done.stderr[-3000:]}")
            results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"per-call host time, median of {args.rounds} interleaved rounds of {args.calls} calls")
    for result in results:
        print(f"\nallocator: {result['allocator']}")
        us = result["us"]
        base = us.get("event_record") or us.get("simdevice event_record")
        for name, value in us.items():
            print(f"  {name:<52} {value:8.3f} us   {value / base:5.2f}x event record")
        if "fallback" in result:
            print(f"  fallback counts: {result['fallback']}")


if __name__ == "__main__":
    main()
