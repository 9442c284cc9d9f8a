"""Dispatch floor of a sanitizer front end: an empty Python TorchDispatchMode
against a C++ boxed fallback on a dispatch key of its own (empty; reaching
Python once per op; walking the op's tensor storages without Python; handing
the op's tensors to Python; capturing the op's call site with the
sanitizer's own capture), on a chain of small tensor ops (CPU unless
--device cuda), each variant in fresh processes, rounds alternating the
order.

    python benchmarks/bench_dispatch_floor.py [--device cpu|cuda] [--rounds 5] [--steps 300] [--repeats 9]

The fallback (benchmarks/dispatch_floor.cpp) is compiled with
torch.utils.cpp_extension into $NPU_LIFETIME_CACHE (else
~/.cache/npu_lifetime), once per torch build and source; without a C++
compiler or ninja the script says so and exits 0. Each C++ variant checks
that its fallback was entered once per op the workload ran, and did its
work for each (Python called, writes walked, tensors handed over, sites
captured naming the workload's line).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from variants import at_least_one, empty_mode, run_rounds  # noqa: E402

SOURCE = Path(__file__).resolve().parent / "dispatch_floor.cpp"
OPS_PER_STEP = 7  # matmul, relu, add, mul_ (in place), sum, mul, tanh
WRITES_PER_STEP = 1  # the mul_
CPP_WORK = {"cpp-empty": 0, "cpp-python-call": 1, "cpp-walk": 2,  # the extension's enable(work)
            "cpp-python-tensors": 3, "cpp-site": 4}
VARIANTS = ("none", "python-mode", *CPP_WORK)


def missing_tools() -> "str | None":
    """Why the extension cannot be built here, or None."""
    from torch.utils import cpp_extension

    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        return f"no C++ compiler ({compiler}) on PATH"
    if not cpp_extension.is_ninja_available():
        return "no ninja on PATH (torch.utils.cpp_extension needs it)"
    return None


def default_build_dir() -> Path:
    import torch

    cache = Path(os.environ.get("NPU_LIFETIME_CACHE", Path.home() / ".cache" / "npu_lifetime"))
    return cache / f"dispatch_floor-torch{torch.__version__}"


def build(build_dir: Path) -> str:
    """Compiles (or finds up to date) the extension; returns its file."""
    from torch.utils import cpp_extension

    build_dir.mkdir(parents=True, exist_ok=True)
    module = cpp_extension.load(
        "dispatch_floor", [str(SOURCE)], build_directory=str(build_dir),
        extra_cflags=["-O2", "-std=c++17", "-Wall", "-Wextra", "-Werror"], verbose=False,
    )
    return module.__file__


def import_built(path: str):
    """Imports the built extension (torch first: it provides libc10 and libtorch)."""
    import importlib.util

    import torch  # noqa: F401

    spec = importlib.util.spec_from_file_location("dispatch_floor", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def workload(a, steps: int) -> int:
    """The chain of small ops (on a's device, waited for at the end);
    returns how many ops it dispatched."""
    import torch

    for _ in range(steps):
        b = a @ a
        c = b.relu()
        d = c + 1
        e = d.mul_(0.5)
        e.sum()
        a = torch.tanh(e * 0.1)
    if a.is_cuda:
        torch.cuda.synchronize()
    return steps * OPS_PER_STEP


class _Variant:
    """Enters and leaves one variant in a child; says what the fallback saw."""

    def __init__(self, name: str, module_path: str):
        self.name, self.module, self.mode, self.python_calls, self.tensors = name, None, None, 0, 0
        if name in CPP_WORK:
            self.module = import_built(module_path)
            self.module.set_on_op(self._on_op)
            self.module.set_site_capture(*site_capture())
        elif name == "python-mode":
            self.mode = empty_mode()

    def _on_op(self, name: str, tensors: tuple = ()) -> None:
        self.python_calls += 1
        self.tensors += len(tensors)

    def enter(self) -> None:
        if self.module is not None:
            self.module.enable(CPP_WORK[self.name])
        elif self.mode is not None:
            self.mode.__enter__()

    def leave(self) -> None:
        if self.module is not None:
            self.module.disable()
        elif self.mode is not None:
            self.mode.__exit__(None, None, None)

    def reset(self) -> None:
        self.python_calls = self.tensors = 0
        if self.module is not None:
            self.module.reset()

    def seen(self) -> dict:
        if self.module is None:
            return {}
        site = self.module.take_last_site()
        return {"key": self.module.key(), "ops_seen": self.module.ops_seen(),
                "python_calls": self.python_calls, "writes_seen": self.module.writes_seen(),
                "tensors": self.tensors, "sites": self.module.sites_captured(),
                "last_site": site.innermost() if site is not None else None}


def site_capture() -> tuple:
    """The sanitizer's own site capture as its storage feed calls it from C
    (no Python frame of ours in between): (callable, args)."""
    from npu_lifetime.sanitizer import native

    depth = 8  # LifetimeSanitizer's default stack_depth
    return native.default().capture, (depth, 0)


def tensor_arguments_per_run(a, steps: int) -> int:
    """The tensor arguments of the workload's ops (lists flattened), as a
    Python dispatch mode sees them (a number wrapped for an op is the
    number there): the reference for cpp-python-tensors."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class Count(TorchDispatchMode):
        seen = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.seen += sum(isinstance(x, torch.Tensor) for x in tree_leaves((args, kwargs or {})))
            return func(*args, **(kwargs or {}))

    start = a.clone()
    with Count():
        workload(start, steps)
    return Count.seen


def run_child(name: str, module_path: str, device: str, steps: int, repeats: int) -> None:
    """Warm up, time ``repeats`` runs, check the fallback saw every op (and
    Python every call, the walk every write); print one JSON line."""
    import torch

    torch.set_num_threads(1)
    a = torch.randn(64, 64, device=device)
    variant = _Variant(name, module_path)
    variant.enter()
    workload(a, steps)  # warm-up: one whole run
    variant.reset()
    times, ops = [], 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        ops = workload(a, steps)
        times.append(time.perf_counter() - t0)
    variant.leave()
    seen = variant.seen()
    expected = {"ops": ops * repeats, "writes": steps * WRITES_PER_STEP * repeats,
                "tensors": tensor_arguments_per_run(a, steps) * repeats if name == "cpp-python-tensors" else 0}
    _check_seen(name, seen, expected)
    print(json.dumps({"times": times, "ops": ops, **seen}))


def _check_seen(name: str, seen: dict, expected: dict) -> None:
    if not seen:
        return
    ops = expected["ops"]
    if seen["ops_seen"] != ops:
        raise SystemExit(f"{name}: the fallback was entered for {seen['ops_seen']} ops, the workload ran {ops}")
    if name in ("cpp-python-call", "cpp-python-tensors") and seen["python_calls"] != ops:
        raise SystemExit(f"{name}: Python was called for {seen['python_calls']} ops of {ops}")
    if name == "cpp-walk" and seen["writes_seen"] != expected["writes"]:
        raise SystemExit(f"{name}: the walk saw {seen['writes_seen']} written arguments, "
                         f"the workload wrote {expected['writes']}")
    if name == "cpp-python-tensors" and seen["tensors"] != expected["tensors"]:
        raise SystemExit(f"{name}: Python was handed {seen['tensors']} tensors, a dispatch mode sees "
                         f"{expected['tensors']}")
    if name == "cpp-site" and (seen["sites"] != ops or "in workload" not in (seen["last_site"] or "")):
        raise SystemExit(f"{name}: {seen['sites']} sites captured for {ops} ops, the last {seen['last_site']!r} "
                         "(it should name the workload)")


def alternate(module_path: str, args: argparse.Namespace) -> dict:
    """Runs every variant ``rounds`` times in fresh processes (order reversed
    every other round); returns each variant's samples and last child result."""
    child_args = ["--module", module_path, "--device", args.device, "--steps", str(args.steps), "--repeats", str(args.repeats)]
    samples, last, _ = run_rounds(__file__, VARIANTS, args.rounds, child_args)
    return {"samples": samples, "last": last}


def report(result: dict, args: argparse.Namespace) -> None:
    samples, last = result["samples"], result["last"]
    ops = last["none"]["ops"]
    us_per_op = {v: statistics.median(samples[v]) / ops * 1e6 for v in VARIANTS}
    base = us_per_op["none"]
    print(f"dispatch floor: {ops} {args.device.upper()} ops per run ({OPS_PER_STEP} per step: 64x64 matmul, relu, add, mul_, sum, "
          f"mul, tanh), 1 CPU thread; C++ fallback on dispatch key {last['cpp-empty']['key']}; medians of "
          f"{args.rounds} rounds x {args.repeats} runs, variants in alternating fresh processes")
    print("columns: median milliseconds per run, microseconds per op, microseconds per op above none, ratio to none; "
          "fastest run in microseconds per op (a check on noise from other processes)")
    print(f"{'variant':<20} {'ms/run':>9} {'us/op':>8} {'+us/op':>8} {'x none':>7} {'best us/op':>11}")
    for v in VARIANTS:
        print(f"{v:<20} {us_per_op[v] * ops / 1e3:>9.2f} {us_per_op[v]:>8.2f} {us_per_op[v] - base:>8.2f} "
              f"{us_per_op[v] / base:>7.2f} {min(samples[v]) / ops * 1e6:>11.2f}")
    print(f"python-mode - cpp-empty = {us_per_op['python-mode'] - us_per_op['cpp-empty']:.2f} us/op; "
          + "; ".join(f"{v} - cpp-empty = {us_per_op[v] - us_per_op['cpp-empty']:.2f} us/op" for v in list(CPP_WORK)[1:]))
    for v in CPP_WORK:
        seen = last[v]
        print(f"{v}: fallback entered for {seen['ops_seen']} of {ops * args.repeats} ops dispatched "
              f"(Python called {seen['python_calls']}, writes walked {seen['writes_seen']}, "
              f"tensors handed over {seen['tensors']}, sites captured {seen['sites']})")
    print(f"cpp-site's last site: {last['cpp-site']['last_site']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--module", help=argparse.SUPPRESS)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="where the workload's tensors live (default cpu; cuda: ops are queued, each run waited for)")
    parser.add_argument("--rounds", type=at_least_one, default=5)
    parser.add_argument("--steps", type=at_least_one, default=300)
    parser.add_argument("--repeats", type=at_least_one, default=9)
    parser.add_argument("--build-dir", type=Path, help="where to compile the extension (default: the cache)")
    args = parser.parse_args()
    if args.device == "cuda" and not args.child:
        import torch

        if not torch.cuda.is_available():
            parser.error("--device cuda needs a CUDA GPU and this machine has none")
    if args.child:
        run_child(args.child, args.module, args.device, args.steps, args.repeats)
        return
    missing = missing_tools()
    if missing:
        print(f"bench_dispatch_floor: skipped: {missing}; the C++ fallback cannot be built", file=sys.stderr)
        return
    t0 = time.perf_counter()
    module_path = build(args.build_dir or default_build_dir())
    print(f"extension ready in {time.perf_counter() - t0:.1f} s: {module_path}", file=sys.stderr)
    report(alternate(module_path, args), args)


if __name__ == "__main__":
    main()
