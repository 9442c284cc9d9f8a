"""Where the lifetime sanitizer's time goes on the 3-stream chain
(benchmarks/bench_sanitizer.py's workload): the same workload in fresh
processes, each timing a baseline (nothing installed) and then one part
switched on, rounds alternating; printed as each part's paired overhead in
us/op (its median run minus the same process's median baseline run).
Diagnostic only: parts with something switched off give no verdicts, and
"switched off" holds for the ops the native dispatch path runs (ops sent to
the Python body, the first op on a new stream and ops that issue device
events inside still feed the model).

  trace        torch's GPU trace layer alone (activated, no subscriber)
  empty-mode   an empty TorchDispatchMode (torch's dispatch floor)
  empty-mode-op  the same, calling the op's C++ binding (func._op) instead
               of OpOverload.__call__
  no-mode      the sanitizer enabled but its dispatch mode popped: its
               device-event and allocation feeds alone (trace layer included)
  no-mode-events-off   no-mode, the device events' handlers (on_event_* ...) no-ops
  no-mode-storage-off  no-mode, the trace's allocations and frees not fed to the table
  lifetime     the whole sanitizer
  no-feed      the whole sanitizer, each op's scanned accesses not fed (no table, no model)
  no-access    the whole sanitizer, the model's per-access call a no-op
  fixed-site   the whole sanitizer, each op's site capture a constant

    python tools/diag_chain_parts.py [--device cuda|sim] [--rounds 3] [--shim]

--shim: every child installs the shim first (its baseline too), so each
part's figure is over the shim alone.
"""
import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from variants import at_least_one  # noqa: E402

PARTS = ("trace", "empty-mode", "empty-mode-op", "no-mode", "no-mode-events-off", "no-mode-storage-off", "lifetime",
         "no-feed", "no-access", "fixed-site")
S_CAPTURE, S_FEED, S_ACCESS = "capture", "feed", "access"  # _dispatch.c's OpFeed fields
EVENT_BODIES = ("on_stream_created", "on_event_created", "on_event_deleted", "on_event_record", "on_event_wait",
                "on_event_sync", "on_current_stream_waits", "on_stream_sync", "on_device_sync", "on_wait_stream")


def _patch_state(field: str, value) -> None:
    """The enabled sanitizer's OpFeed made again with ``field`` replaced."""
    from npu_lifetime.sanitizer import dispatch

    fields = dispatch._op_feed_fields(dispatch._active)
    fields[field] = value
    dispatch._fast_path.common(dispatch._fast_path.OpFeed(**fields))


def _nothing(*args) -> None:
    return None


class _NoTrace:
    """A storage feed that drops the trace's allocations and frees."""

    trace_alloc = trace_free = staticmethod(_nothing)


def _setup(part: str, device: str):
    """Switches ``part`` on; returns a context to time under (or None)."""
    import torch

    if part == "trace":
        import torch.cuda._gpu_trace  # noqa: F401  (torch looks its registries up there on each call)

        torch._C._activate_gpu_trace()
        return None
    if part == "empty-mode":
        from variants import empty_mode

        mode = empty_mode()
        mode.__enter__()
        return None
    if part == "empty-mode-op":
        from torch.utils._python_dispatch import TorchDispatchMode

        class BindingMode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                return func._op(*args, **(kwargs or {}))

        BindingMode().__enter__()
        return None
    from npu_lifetime.sanitizer import LifetimeSanitizer

    sanitizer = LifetimeSanitizer(device, on_race="warn").enable()
    if part == "no-mode-events-off":
        for name in EVENT_BODIES:
            setattr(sanitizer, name, _nothing)
    if part == "no-mode-storage-off":
        sanitizer._storage_feed = _NoTrace()  # what the trace's delivery (and _trace_alloc / _trace_free) call
    if part.startswith("no-mode"):
        from torch.utils._python_dispatch import _pop_mode_temporarily

        return _pop_mode_temporarily
    if part == "no-feed":
        _patch_state(S_FEED, lambda *args: [])
    if part == "no-access":
        _patch_state(S_ACCESS, lambda *args: [])
    if part == "fixed-site":
        from npu_lifetime.sanitizer import native

        site = native.frames.capture(8, 0)
        _patch_state(S_CAPTURE, lambda depth, skip: site)
    return None


def _child(part: str, device: str, steps: int, repeats: int, shim: bool) -> None:
    import torch

    if shim:
        import npu_lifetime

        npu_lifetime.install("cuda")
    from bench_sanitizer import _device, workload

    torch.set_num_threads(1)
    dev = _device(device)

    def timed() -> list:
        workload(dev, 20)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            ops = workload(dev, steps)
            times.append((time.perf_counter() - t0) / ops * 1e6)
        return times

    baseline = timed()
    context = _setup(part, device)
    if context is None:
        times = timed()
    else:
        with context():
            times = timed()
    print(json.dumps({"baseline": baseline, "times": times}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child")
    parser.add_argument("--device", choices=["cuda", "sim"], default="cuda")
    parser.add_argument("--rounds", type=at_least_one, default=3)
    parser.add_argument("--steps", type=at_least_one, default=200)
    parser.add_argument("--repeats", type=at_least_one, default=5)
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument("--shim", action="store_true", help="the shim installed in every child (CUDA only)")
    args = parser.parse_args()
    if args.child:
        _child(args.child, args.device, args.steps, args.repeats, args.shim)
        return
    parts = [p for p in args.parts.split(",") if p]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        parser.error(f"unknown parts {unknown}; choose from {', '.join(PARTS)}")
    if args.device == "sim":
        parts = [p for p in parts if p != "trace"]
    added = {p: [] for p in parts}
    for r in range(args.rounds):
        for part in parts if r % 2 == 0 else reversed(parts):
            done = subprocess.run([sys.executable, __file__, "--child", part, "--device", args.device,
                                   "--steps", str(args.steps), "--repeats", str(args.repeats),
                                   *(["--shim"] if args.shim else [])],
                                  capture_output=True, text=True, cwd=ROOT, timeout=300)
            if done.returncode != 0:
                raise SystemExit(f"{part} failed:\n{done.stderr[-3000:]}")
            got = json.loads(done.stdout.strip().splitlines()[-1])
            added[part].append(statistics.median(got["times"]) - statistics.median(got["baseline"]))
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{p} +{added[p][-1]:.2f}" for p in parts),
              file=sys.stderr, flush=True)
    print(f"chain, device {args.device}{' over the shim' if args.shim else ''}, {args.steps} steps x {args.repeats} runs per block, {args.rounds} rounds: "
          "paired overhead in us/op (median of rounds; each round's)")
    for part in parts:
        print(f"{part:<20} {statistics.median(added[part]):+8.2f}   ({', '.join(f'{a:+.2f}' for a in added[part])})")


if __name__ == "__main__":
    main()
