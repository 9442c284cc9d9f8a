"""The ``npu-lifetime`` command line."""
from __future__ import annotations

import argparse
import os
import sys
from typing import Optional


def _fuzz(args: argparse.Namespace) -> int:
    from .fuzz import FuzzConfig, fuzz
    from .progress import Progress

    config = FuzzConfig(
        schedules=args.schedules, seed=args.seed, jobs=args.jobs, max_steps=args.max_steps,
        max_streams=args.max_streams, max_events=args.max_events,
        misuse=not args.no_misuse, execute=args.execute,
    )
    progress = Progress(config.schedules, "fuzz", "schedules")
    result = fuzz(config, progress=None if args.quiet else progress)
    progress.close()
    print(
        f"checked {result.checked} schedules in {result.seconds:.1f} s "
        f"({result.per_minute:,.0f} schedules/min, {config.jobs} job(s), seed {config.seed}); "
        f"{'1 disagreement' if result.failure else '0 disagreements'}"
    )
    if result.failure is None:
        return 0
    print(f"\nminimal failing schedule (worker {result.failure.worker}, seed {config.seed + result.failure.worker}):")
    print(result.failure.problem)
    print("\n# reproducer\n" + result.failure.schedule.to_python())
    return 1


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
    p.add_argument("--no-misuse", action="store_true", help="no double frees, use-after-free or unrecorded waits")
    p.add_argument("--execute", action="store_true", help="also check verdicts on the simulated device (slower)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress line")
    p.set_defaults(run=_fuzz)
    return parser


def main(argv: Optional[list] = None) -> int:
    args = _parser().parse_args(argv)
    for name in ("schedules", "jobs", "max_steps", "max_streams"):
        if getattr(args, name, 1) < 1:
            print(f"npu-lifetime: --{name.replace('_', '-')} must be at least 1", file=sys.stderr)
            return 2
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
