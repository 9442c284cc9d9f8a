"""Host cost of one record_use call, against a raw event record and
record_stream, measured in the same run (interleaved rounds, medians).

    python benchmarks/bench_record_use.py [--device auto|cuda|sim|fallback|npu] [--calls 20000] [--rounds 7]
                                          [--json PATH]

Last, a summary of the headline figures, each as a ratio to the raw event
record of its own run, with issue 39's targets: the entry under the shim
(npu_lifetime.record_use and Tensor.record_use) <= 1.2x, bare
npl_record_use through ctypes (no target), the fallback <= 1.5x for one
storage and <= 2x for a new storage each call.  ``--json`` writes every
figure and the summary.  Each run times the event record twice
("event_record, again"): a difference smaller than theirs is noise.

cuda: one child process with the shim installed (the C entry, Tensor.record_use,
the Python reference entry, bare npl_record_use), one with the native
caching allocator (the fallback, for one storage re-recorded and for a new
storage each call), and the fallback once
more with torch's events instead of raw CUDA events
(NPU_LIFETIME_TORCH_EVENTS=1), for comparison.  sim: the same fast
path on CPU tensors over the shim's simulated runtime, simdevice streams:
the Python overhead only, there is no device call behind it.  fallback:
NativeFallback.record itself over a fake device API whose event record and
query are no-ops (its reaper thread running): the fallback's own Python
overhead, what a CPU machine can measure of the GPU cost (which adds the
event record and the fast path's checks).  npu: the real torch_npu over
the stand-in CANN runtime (tests/platforms/npu_standin; CPU-only), one child with the
shim through the NPU bridge (the entry, Tensor.record_use, bare
npl_record_use) and one with torch_npu's allocator (the fallback, one
storage and a new storage each call), each beside torch.npu.Event.record:
the host side of torch_npu's Python and C++ with a CPU runtime behind it.
What the stand-in cannot tell: the cost of aclrtRecordEvent on an NPU and
of torch_npu's task queue handing it to the device, which the ratios'
denominator holds on hardware.
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


def per_call_us(fns: dict, calls: int, rounds: int, clock=time.perf_counter) -> dict:
    """{name: median over rounds of the per-call time}, rounds interleaved
    so that drift hits every function alike.  ``clock``: wall time where a
    device works behind the calls; the thread's CPU time
    (time.thread_time) where nothing does, on a shared machine."""
    return timed(fns, calls, rounds, clock)["us"]


def per_call_rounds(fns: dict, calls: int, rounds: int, clock=time.perf_counter) -> dict:
    """{name: the per-call time of each round}, as per_call_us times them."""
    samples = {name: [] for name in fns}
    for fn in fns.values():
        for _ in range(min(calls, 1000)):
            fn()  # warm-up
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = clock()
            for _ in range(calls):
                fn()
            samples[name].append((clock() - t0) / calls * 1e6)
    return samples


def timed(fns: dict, calls: int, rounds: int, clock=time.perf_counter) -> dict:
    """A child's figures: the medians ("us") and each round's times
    ("rounds", for the summary's paired ratios)."""
    samples = per_call_rounds(fns, calls, rounds, clock)
    return {"us": {name: statistics.median(v) for name, v in samples.items()}, "rounds": samples}


def pin_to_one_core() -> None:
    """The timing child on one core of those it may use (the last: core 0
    takes most interrupts), so that a migration between cores does not
    land in one variant's rounds only.  Where the platform has no affinity,
    nothing."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})


def cuda_shim(calls: int, rounds: int) -> dict:
    return device_shim("cuda", calls, rounds)


def npu_shim(calls: int, rounds: int) -> dict:
    """The shim through the NPU bridge, on torch_npu over the stand-in CANN
    runtime: host costs, with a CPU runtime behind the event record."""
    return device_shim("npu", calls, rounds)


def device_shim(device_type: str, calls: int, rounds: int) -> dict:
    import npu_lifetime

    npu_lifetime.install(device_type)  # the default policy
    import torch

    from npu_lifetime import recording, shim

    if device_type == "npu":
        import torch_npu  # noqa: F401  (registers torch.npu)
        from npu_lifetime.shim import npu_queue

        stream_handle = npu_queue.stream_handle
    else:
        def stream_handle(stream):
            return stream.cuda_stream
    module = getattr(torch, device_type)
    side = module.Stream()
    x = torch.ones(1024, device=device_type)
    event = module.Event()
    npu_lifetime.record_use(x, side)  # enables the fast path
    lib, ptr, handle = shim.libnpl.library(), x.data_ptr(), stream_handle(side)

    def current_stream_call():
        with module.stream(side):
            npu_lifetime.record_use(x)

    def event_in_stream_context():
        with module.stream(side):
            event.record()

    tensor_method, reference_call = entry_variants(x, side)
    out = timed({
        "event_record": lambda: event.record(side),
        "record_use": lambda: npu_lifetime.record_use(x, side),
        "Tensor.record_use": tensor_method,
        "record_use (Python reference entry)": reference_call,
        "npl_record_use (ctypes only)": lambda: lib.npl_record_use(ptr, handle),
        "record_stream": lambda: x.record_stream(side),
        "event_record, again": lambda: event.record(side),
        "record_use, current stream (in a stream context)": current_stream_call,
        "event_record, current stream (in a stream context)": event_in_stream_context,
    }, calls, rounds)
    module.synchronize()
    return {"allocator": f"{device_type}: shim ({shim.policy()})", **out}


def entry_variants(x, side) -> tuple:
    """Tensor.record_use (installed here) and the pure-Python entry with its
    Python fast path (swapped in around each call: two global stores), for
    the route now active."""
    from npu_lifetime import recording
    from npu_lifetime.recording import calls as recording_calls

    try:
        recording.install_tensor_method()
        tensor_method = lambda: x.record_use(side)  # noqa: E731
    except recording.RecordUseError:  # torch has its own: not ours to time
        tensor_method = lambda: None  # noqa: E731
    c_fast = recording_calls._fast
    route = next(r for r in recording_calls._routes.values() if r.fast is c_fast)
    python_fast = route.make_fast_reference()

    def reference_call():
        recording_calls._fast = python_fast
        recording_calls.record_use_reference(x, side)
        recording_calls._fast = c_fast

    return tensor_method, reference_call


def native(device_type: str, calls: int, rounds: int) -> dict:
    """record_use through the fallback (no shim) on cuda or npu: one storage
    re-recorded, a new storage each call, against a raw event record and
    record_stream, all in one run."""
    import torch

    import npu_lifetime
    from npu_lifetime.recording import torch_allocator_fallback
    from npu_lifetime.recording.torch_allocator_fallback import FALLBACK

    if device_type == "npu":
        import torch_npu  # noqa: F401  (registers torch.npu)
    module = getattr(torch, device_type)
    side = module.Stream()
    x = torch.ones(1024, device=device_type)
    event = module.Event()
    fresh = [torch.ones(256, device=device_type) for _ in range(calls)]
    position = [0]

    def new_storage():  # a storage the fallback holds nothing for yet (FSDP's all-gather outputs)
        i = position[0] = (position[0] + 1) % calls
        npu_lifetime.record_use(fresh[i], side)

    out = timed({
        "event_record": lambda: event.record(side),
        "record_use (fallback), one storage": lambda: npu_lifetime.record_use(x, side),
        "record_use (fallback), a new storage each call": new_storage,
        "record_stream": lambda: x.record_stream(side),
        "event_record, again": lambda: event.record(side),
    }, calls, rounds)
    module.synchronize()
    fallback = FALLBACK.for_device(device_type)
    table = getattr(getattr(torch_allocator_fallback, "Table", None), "__module__", "none: before the table")
    table_object = getattr(fallback, "_table", None)
    events = "raw CUDA events" if getattr(table_object, "uses_runtime", False) else f"torch.{device_type}.Event"
    return {"allocator": f"{device_type} native caching allocator (table: {table}; {events})", **out,
            "fallback": dict(fallback.counts)}


def cuda_native(calls: int, rounds: int) -> dict:
    return native("cuda", calls, rounds)


def npu_native(calls: int, rounds: int) -> dict:
    """torch_npu's own allocator over the stand-in CANN runtime (tests/platforms/npu_standin):
    host costs of torch_npu's Python and C++ with a CPU runtime behind them."""
    return native("npu", calls, rounds)


def fallback_fake(calls: int, rounds: int) -> list:
    """NativeFallback over a fake device API: no device call behind it.
    Timed in the calling thread's CPU time (on a shared machine wall time
    would mostly measure the neighbours): one storage re-recorded, a new
    storage each call (the storages are made, and released after, outside
    the timing), the fast path's call (fallback.fast: its type checks, then
    the same record) and the whole ``npu_lifetime.record_use`` call over it
    (the Python entry: compile and dispatch-mode checks).  Twice: events
    through the device API's callables (C callables that do nothing, as
    torch's bindings are C calls: operator.is_ for the event record, bool
    for the capture check), and raw events through the stand-in libcudart of
    tests/helpers/fake_cudart (the path a CUDA build takes; its calls take a mutex
    and count)."""
    results = [_fallback_fake_run(calls, rounds)]
    try:
        sys.path.insert(0, str(ROOT / "tests"))
        from helpers import fake_cudart

        from npu_lifetime.recording._holds import CudaRuntime
    except (ImportError, OSError, subprocess.CalledProcessError) as err:  # no extension or no C compiler
        print(f"raw events not measured: {err}")
        return results
    fake = fake_cudart.FakeCudart()
    fake.reset()
    fake.stream_device(2, -1)  # the side stream, on a CPU tensor's device
    results.append(_fallback_fake_run(calls, rounds, runtime=lambda: CudaRuntime(fake.path), run=fake.run))
    return results


def _fallback_fake_run(calls: int, rounds: int, runtime=None, run=None) -> dict:
    """One fallback_fake run; ``runtime``: a CudaRuntime maker (raw events),
    ``run(handle)``: its stream's work finishes."""
    import operator

    import torch

    import npu_lifetime
    from npu_lifetime.recording import calls as recording_calls
    from npu_lifetime.recording.torch_allocator_fallback import CaptureGate, NativeFallback

    class Stream:
        def __init__(self, handle):
            self.handle, self.device_index = handle, -1  # a CPU tensor's get_device()

    class Event:
        def record(self, stream):
            pass

    class FakeAPI:
        device_type = "cpu"  # the fast path takes CPU tensors
        fired = False  # nothing fires while timed: every entry stays held
        query = staticmethod(lambda event: FakeAPI.fired)
        new_event = Event
        handle, device_index = operator.attrgetter("handle"), operator.attrgetter("device_index")
        is_capturing = bool  # () -> False
        record_event = operator.is_  # (event, stream) -> a C call that does nothing
        stream_type = staticmethod(lambda: Stream)
        # one segment holding every address, allocated on stream 1 (the uses are on stream 2)
        segments = staticmethod(lambda: [{"address": 0, "total_size": 1 << 62, "device": -1, "stream": 1}])
        segment_version = staticmethod(lambda device: (0, 0))

    if runtime is not None:
        FakeAPI.runtime = staticmethod(runtime)
    fallback = NativeFallback(FakeAPI(), gate=CaptureGate())
    side, event, x, y, z, w = Stream(2), Event(), torch.ones(4), torch.ones(4), torch.ones(4), torch.ones(4)
    entry = recording_calls.fallback_fast_path(fallback.fast, "is_cpu", lambda device: None)
    python_entry = recording_calls.fallback_fast_path_reference(fallback.fast, "is_cpu", lambda device: None)
    names = ["event_record (a Python no-op)", "NativeFallback.record, one storage",
             "NativeFallback.record, a new storage each call", "NativeFallback.fast, one storage",
             "npu_lifetime.record_use over it, one storage",
             "the Python reference entry over it, one storage"]
    samples = {name: [] for name in names}
    saved_fast = recording_calls._fast
    recording_calls._fast = entry  # record_use's fast path, as _fallback_fast makes it for cuda
    try:
        for _ in range(rounds + 1):  # the first round warms up
            fresh = [torch.ones(4) for _ in range(calls)]
            times = [time.thread_time()]
            for _ in range(calls):
                event.record(side)
            times.append(time.thread_time())
            for _ in range(calls):
                fallback.record(x, side)
            times.append(time.thread_time())
            for t in fresh:
                fallback.record(t, side)
            times.append(time.thread_time())
            for _ in range(calls):
                fallback.fast(y, side)
            times.append(time.thread_time())
            for _ in range(calls):
                npu_lifetime.record_use(z, side)
            times.append(time.thread_time())
            recording_calls._fast = python_entry
            for _ in range(calls):
                recording_calls.record_use_reference(w, side)
            recording_calls._fast = entry
            times.append(time.thread_time())
            for name, t0, t1 in zip(samples, times, times[1:]):
                samples[name].append((t1 - t0) / calls * 1e6)
            FakeAPI.fired = True
            if run is not None:
                run(side.handle)
            fallback.reclaim()
            FakeAPI.fired = False
    finally:
        recording_calls._fast = saved_fast
    fallback.stop_background()
    out = {name: statistics.median(v[1:]) for name, v in samples.items()}
    table = fallback._table
    events = "raw events, stand-in libcudart" if table.uses_runtime else "events through the callables"
    return {"allocator": "none: the fallback over a fake device API (its own cost, thread CPU time; table: "
                         f"{type(table).__module__}; {events})", "us": out, "fallback": fallback.counts}


def sim(calls: int, rounds: int) -> dict:
    import npu_lifetime
    from npu_lifetime import recording, shim, simdevice
    from npu_lifetime.handoff import SimHandoffDevice

    device = SimHandoffDevice()
    side = simdevice.Stream()
    x = device.empty(1024, simdevice.default_stream())
    event = simdevice.Event()
    lib, ptr, handle = shim.libnpl.library(), x.data_ptr(), device.handle(side)
    with recording.shim_route(device.route):
        npu_lifetime.record_use(x, side)
        tensor_method, reference_call = entry_variants(x, side)

        def current_stream_call():
            with simdevice.stream(side):
                npu_lifetime.record_use(x)

        def event_in_stream_context():
            with simdevice.stream(side):
                event.record()

        out = per_call_us({
            "simdevice event_record": lambda: event.record(side),
            "record_use": lambda: npu_lifetime.record_use(x, side),
            "Tensor.record_use": tensor_method,
            "record_use (Python reference entry)": reference_call,
            "npl_record_use (ctypes only)": lambda: lib.npl_record_use(ptr, handle),
            "simdevice event_record, again": lambda: event.record(side),
            "record_use, current stream (in a stream context)": current_stream_call,
            "event_record, current stream (in a stream context)": event_in_stream_context,
        }, calls, rounds, clock=time.thread_time)
    return {"allocator": f"shim on its simulated runtime ({shim.policy()}; thread CPU time)", "us": out}


NOOP_SOURCE = "int npl_noop(void *ptr, void *stream) { (void)ptr; (void)stream; return 0; }\n"


def entry_own_cost(calls: int, rounds: int):
    """The entries' own host cost: the C entry and the Python one, each with
    a no-op (compiled here) in place of the shim's npl_record_use, against
    a ctypes call of the same no-op.  The active fast path is swapped in
    around each call for both alike (two global stores).  None without a C
    compiler or without the C entry."""
    import ctypes
    import operator
    import shutil
    import tempfile

    import torch

    import npu_lifetime  # noqa: F401
    from npu_lifetime import recording, simdevice
    from npu_lifetime.recording import calls as recording_calls

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or recording_calls._entry is None:
        return None
    folder = Path(tempfile.mkdtemp(prefix="npl_noop"))
    (folder / "noop.c").write_text(NOOP_SOURCE)
    subprocess.run([cc, "-shared", "-fPIC", "-O2", str(folder / "noop.c"), "-o", str(folder / "libnoop.so")],
                   check=True)
    noop = ctypes.CDLL(str(folder / "libnoop.so")).npl_noop
    noop.argtypes, noop.restype = [ctypes.c_void_p, ctypes.c_void_p], ctypes.c_int
    # shaped as the cuda route is: the handle an attribute, the tensor's device from Tensor.get_device
    route = recording_calls._ShimRoute(
        "cpu", simdevice.Stream, handle=operator.attrgetter("handle"), current_handle=lambda t: 1,
        device_flag="is_cpu", device_index=torch.Tensor.get_device, handle_attr="handle")
    c_fast = recording_calls._entry.ShimFast(
        ctypes.cast(noop, ctypes.c_void_p).value, simdevice.Stream, route.handle_attr, route.current_handle,
        route.device_flag, route.device_index, recording_calls._shim_refused, recording_calls._dispatch_modes)
    saved_native = recording_calls._npl_record_use
    recording_calls._npl_record_use = lambda: noop
    try:
        python_fast = route.make_fast_reference()
    finally:
        recording_calls._npl_record_use = saved_native
    x, side, previous = torch.ones(4), simdevice.Stream(), recording_calls._fast
    side.device_index = x.get_device()  # a CPU tensor's: -1

    def over(fast, entry):
        def call():
            recording_calls._fast = fast
            entry(x, side)
            recording_calls._fast = previous
        return call

    out = per_call_us({
        "ctypes call of the no-op": lambda: noop(8, 16),
        "C entry over the no-op": over(c_fast, recording_calls.record_use),
        "Python entry over the no-op": over(python_fast, recording_calls.record_use_reference),
        "ctypes call of the no-op, again": lambda: noop(8, 16),
    }, calls, rounds, clock=time.thread_time)
    return {"allocator": "none: the entries over a no-op in place of npl_record_use (their own cost; thread CPU time)", "us": out}


CHILDREN = {"cuda_shim": cuda_shim, "cuda_native": cuda_native, "npu_shim": npu_shim, "npu_native": npu_native}


def run_child(child: str, calls: int, rounds: int, python: str = sys.executable, env: dict = None) -> dict:
    env = dict(env or os.environ, PYTHONWARNINGS="ignore")
    env["PYTHONPATH"] = ":".join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    done = subprocess.run([python, __file__, "--child", child, "--calls", str(calls), "--rounds", str(rounds)],
                          capture_output=True, text=True, env=env, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"{child} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def npu_standin_children(calls: int, rounds: int) -> list:
    """npu_shim and npu_native in the torch_npu interpreter over the stand-in
    CANN runtime (tests/helpers/npu_helpers.py finds both, building the stand-in
    once)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from helpers import npu_helpers

    python = npu_helpers.npu_python()
    if python is None:
        raise SystemExit("--device npu needs the torch_npu interpreter (.venv-npu or NPU_LIFETIME_NPU_PYTHON)")
    return [run_child(child, calls, rounds, python=python, env=npu_helpers.npu_environment())
            for child in ("npu_shim", "npu_native")]


# (row, its key in a result's "us", the target ratio to that run's event record or None)
HEADLINES = [
    ("record_use under the shim", "record_use", 1.2),
    ("Tensor.record_use under the shim", "Tensor.record_use", 1.2),
    ("bare npl_record_use (ctypes)", "npl_record_use (ctypes only)", None),
    ("fallback, one storage", "record_use (fallback), one storage", 1.5),
    ("fallback, a new storage each call", "record_use (fallback), a new storage each call", 2.0),
]


def summary(results: list) -> list:
    """The headline rows found in ``results`` (the first result holding
    each): name, us, ratio to that run's event record, target, met, and the
    event record's own spread (its two timings).  Where a result has its
    rounds, the ratio is paired: the median over rounds of the row's time
    over the mean of the two event-record timings of the same round (a slow
    moment of the host then weighs on both sides of the ratio); else the
    ratio of the medians to the first timing."""
    rows = []
    for name, key, target in HEADLINES:
        result = next((r for r in results if key in r["us"]), None)
        if result is None:
            continue
        us = result["us"]
        record_keys = [k for k in us if "event_record" in k and "stream context" not in k]
        records = [us[k] for k in record_keys]
        if "rounds" in result:
            per_round = zip(result["rounds"][key], *(result["rounds"][k] for k in record_keys))
            ratio = statistics.median(t / statistics.fmean(base) for t, *base in per_round)
        else:
            ratio = us[key] / records[0]
        rows.append({"name": name, "us": us[key], "event_record_us": records[0], "ratio": ratio, "target": target,
                     "met": None if target is None else ratio <= target, "paired": "rounds" in result,
                     "event_record_spread": max(records) / min(records) - 1, "allocator": result["allocator"]})
    return rows


def print_summary(rows: list, simulated: bool = False) -> None:
    print("\nsummary (ratio to the raw event record of the same run, paired by round where the rounds were kept: "
          "the median of each round's time over that round's two event-record timings; spread: its two timings)")
    if simulated:
        print("  (simulated: the event record is simdevice's Python; the targets apply to a device's raw record)")
    for row in rows:
        target = "" if row["target"] is None or simulated else \
            f"target <= {row['target']}x: {'met' if row['met'] else 'NOT met'}"
        print(f"  {row['name']:<36} {row['us']:8.3f} us  {row['ratio']:5.2f}x  "
              f"(event record {row['event_record_us']:.3f} us, spread {row['event_record_spread']:.1%})  {target}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto", choices=["auto", "cuda", "sim", "fallback", "npu"])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--child", choices=sorted(CHILDREN))
    parser.add_argument("--json", metavar="PATH", help="also write every figure and the summary to PATH")
    args = parser.parse_args()
    for name in ('calls', 'rounds'):  # each a count: 0 or less measures nothing
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, not {getattr(args, name)}")
    if args.child:
        pin_to_one_core()
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
        own = entry_own_cost(args.calls, args.rounds)
        results += [own] if own else []
    elif device == "fallback":
        results = fallback_fake(args.calls, args.rounds)
    elif device == "npu":
        results = npu_standin_children(args.calls, args.rounds)
    else:
        results = [run_child(child, args.calls, args.rounds) for child in ("cuda_shim", "cuda_native")]
        # the fallback again with torch's events (the table's CudaRuntime off): both in one run
        torch_events = dict(os.environ, NPU_LIFETIME_TORCH_EVENTS="1")
        results.append(run_child("cuda_native", args.calls, args.rounds, env=torch_events))
    print(f"per-call host time, median of {args.rounds} interleaved rounds of {args.calls} calls")
    for result in results:
        print(f"\nallocator: {result['allocator']}")
        us = result["us"]
        base_name, base = next(((k, v) for k, v in us.items() if "event_record" in k), next(iter(us.items())))
        for name, value in us.items():
            print(f"  {name:<52} {value:8.3f} us   {value / base:5.2f}x {base_name}")
        if "fallback" in result:
            print(f"  fallback counts: {result['fallback']}")
    rows = summary(results)
    print_summary(rows, simulated=device == "sim")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": device, "calls": args.calls, "rounds": args.rounds,
                                               "results": results, "summary": rows}, indent=2, default=str))


if __name__ == "__main__":
    main()
