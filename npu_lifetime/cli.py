"""The ``npu-lifetime`` command line."""
from __future__ import annotations

import argparse
import os
import sys
import warnings
from typing import Optional


def _fuzz(args: argparse.Namespace) -> int:
    from .fuzz import FuzzConfig, fuzz
    from .progress import Progress

    config = FuzzConfig(
        schedules=args.schedules, seed=args.seed, jobs=args.jobs, max_steps=args.max_steps,
        max_streams=args.max_streams, max_events=args.max_events, max_devices=args.max_devices,
        misuse=not args.no_misuse, execute=args.execute,
    )
    progress = Progress(config.schedules, "fuzz", "schedules")
    result = fuzz(config, progress=None if args.quiet else progress)
    progress.close()
    checks = "the lifetime model vs its independent oracle (happens-before graph)"
    if config.execute:
        checks += ", and the model's verdicts on the simulated device"
    print(
        f"checked {result.checked} schedules ({result.tally.steps} steps) in {result.seconds:.1f} s: "
        f"{result.per_minute:,.0f} schedules/min, {result.steps_per_minute:,.0f} steps/min, "
        f"{config.jobs} job(s), seed {config.seed}"
    )
    print(f"compared: {checks}")
    print(f"{'1 disagreement' if result.failure else '0 disagreements'}")
    for line in result.tally.describe():
        print(line)
    if result.failure is None:
        return 0
    print(f"\nminimal failing schedule (worker {result.failure.worker}, seed {config.seed + result.failure.worker}):")
    print(result.failure.problem)
    print("\n# reproducer\n" + result.failure.schedule.to_python(result.failure.check))
    return 1


def _check(args: argparse.Namespace) -> int:
    from .sanitizer.runner import EXIT_USAGE, CheckError, check_script, write_json

    try:
        result = check_script(
            args.script, args.args, device=args.device, shim=args.shim, policy=args.policy,
            live=not args.no_live, on_race=args.on_race, strict=args.strict,
        )
    except CheckError as err:
        print(f"npu-lifetime check: {err}", file=sys.stderr)
        return EXIT_USAGE
    print(result.report)
    write_json(result, args.json)
    return result.exit_code


def _snapshot(args: argparse.Namespace) -> int:
    import json
    import runpy

    from . import shim
    from .sanitizer.runner import resolve_device

    device = resolve_device(args.device)
    if device == "sim":
        shim.select_runtime("sim")
    else:
        from .shim.install import install

        install(device)
    sys.argv = [args.script, *args.args]
    runpy.run_path(args.script, run_name="__main__")
    snap, stats = shim.snapshot(), shim.stats()
    if args.json:
        print(json.dumps({"stats": stats.__dict__, "snapshot": snap}, indent=2))
        return 0
    print(f"runtime {snap['runtime']}, policy {snap['policy']}")
    print(f"live {stats.live_blocks} blocks / {stats.live_bytes} B, cached {stats.cached_blocks} / "
          f"{stats.cached_bytes} B, pending {stats.pending_blocks} / {stats.pending_bytes} B, "
          f"reserved {stats.reserved_bytes} B (peak {stats.peak_reserved_bytes} B)")
    for seg in snap["segments"]:
        print(f"segment {seg['address']:#x} {seg['size']} B device {seg['device']} stream {seg['stream']:#x} ({seg['pool']})")
        for b in seg["blocks"]:
            extra = ""
            if b["recorded_streams"]:
                extra += " recorded " + ",".join(f"{s:#x}" for s in b["recorded_streams"])
            if b["use_events"]:
                extra += " use events " + ",".join(f"{e['stream']:#x}" for e in b["use_events"])
            if b["held_events"]:
                extra += f" waiting on {b['held_events']} event(s)"
            print(f"  {b['address']:#x} {b['size']:>10} B {b['state']:<8}{extra}")
    return 0


def _handoff(args: argparse.Namespace) -> int:
    from .handoff import CudaHandoffDevice, SimHandoffDevice
    from .handoff.table import format_table, handoff_table

    if args.device == "cuda":
        from .shim.install import install

        install("cuda")
        device = CudaHandoffDevice()
    else:
        device = SimHandoffDevice()
    rows, ok = handoff_table(device, layers=args.layers, width=args.width)
    print(f"FSDP-style hand-off, {args.layers} layers, {args.width}x{args.width} buffers, device {device.name}, "
          "under the lifetime sanitizer")
    print(format_table(rows))
    print("all as expected" if ok else "UNEXPECTED: a correct hand-off had findings or different outputs, "
          "or a broken one went unreported")
    return 0 if ok else 1


def _bench(args: argparse.Namespace) -> int:
    import runpy
    from pathlib import Path

    scripts = Path(__file__).resolve().parent.parent / "benchmarks"
    script = scripts / f"bench_{args.name}.py"
    if not script.exists():
        names = sorted(p.stem[len("bench_"):] for p in scripts.glob("bench_*.py"))
        print(f"npu-lifetime: no benchmark {args.name!r}; available: {', '.join(names) or 'none (not a repo checkout)'}",
              file=sys.stderr)
        return 2
    sys.argv = [str(script), *args.args]
    runpy.run_path(str(script), run_name="__main__")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="npu-lifetime",
        description="Cross-stream lifetime checking for PyTorch (CUDA, Ascend NPU, simulated).",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("fuzz", help="check the lifetime model against its oracle on random schedules")
    p.add_argument("-n", "--schedules", type=int, default=10_000, help="how many schedules (default 10000)")
    p.add_argument("--seed", type=int, default=0, help="base seed; worker k uses seed+k")
    p.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1, help="worker processes (default: all cores)")
    p.add_argument("--max-steps", type=int, default=40)
    p.add_argument("--max-streams", type=int, default=4)
    p.add_argument("--max-events", type=int, default=3)
    p.add_argument("--max-devices", type=int, default=2, help="devices the streams are spread over (default 2)")
    p.add_argument("--no-misuse", action="store_true", help="no double frees, use-after-free or unrecorded waits")
    p.add_argument("--execute", action="store_true", help="also check verdicts on the simulated device (slower)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress line")
    p.set_defaults(run=_fuzz)

    p = sub.add_parser(
        "check", help="run a script under the lifetime sanitizer",
        description="Runs SCRIPT under the lifetime sanitizer and reports its findings. Exit codes: "
                    "0 clean (latent findings may be listed), 1 findings that fail the check (data races, "
                    "reuse races, uncovered frees a reuse race followed, invalid frees...; with --strict "
                    "every contract violation), 2 bad usage (no such script, a device this machine lacks), "
                    "3 the script itself failed.",
    )
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "npu", "sim"])
    p.add_argument("--shim", action="store_true", help="install the allocator shim first (cuda/npu)")
    p.add_argument("--policy", default="poll", choices=["poll", "stream_wait"])
    p.add_argument("--json", metavar="FILE", help="also write the findings as JSON")
    p.add_argument("--no-live", action="store_true", help="leave out storages still alive at the end")
    p.add_argument("--on-race", default="collect", choices=["collect", "warn", "raise"])
    p.add_argument("--strict", action="store_true",
                   help="fail on every contract violation: latent uncovered frees and live uncovered uses too")
    p.add_argument("script")
    p.add_argument("args", nargs=argparse.REMAINDER)
    p.set_defaults(run=_check)

    p = sub.add_parser("snapshot", help="run a script with the shim and show its blocks at the end")
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "npu", "sim"])
    p.add_argument("--json", action="store_true")
    p.add_argument("script")
    p.add_argument("args", nargs=argparse.REMAINDER)
    p.set_defaults(run=_snapshot)

    p = sub.add_parser("handoff", help="run the FSDP-style hand-off harness (recipe vs record_use vs record_stream)")
    p.add_argument("--device", default="sim", choices=["sim", "cuda"])
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--width", type=int, default=64)
    p.set_defaults(run=_handoff)

    p = sub.add_parser("bench", help="run a benchmark script from benchmarks/ (model, shim_alloc, ...)")
    p.add_argument("name")
    p.add_argument("args", nargs=argparse.REMAINDER)
    p.set_defaults(run=_bench)
    return parser


def main(argv: Optional[list] = None) -> int:
    # a CPU torch without numpy says so at import; it is not ours to report
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    args = _parser().parse_args(argv)
    for name in ("schedules", "jobs", "max_steps", "max_streams", "max_devices"):
        if getattr(args, name, 1) < 1:
            print(f"npu-lifetime: --{name.replace('_', '-')} must be at least 1", file=sys.stderr)
            return 2
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
