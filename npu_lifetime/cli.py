"""The ``npu-lifetime`` command line."""
from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from typing import Optional, TextIO

# The exit codes of every command (sanitizer/runner.py's EXIT_* for check are the same numbers).
EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_SCRIPT_FAILED = 0, 1, 2, 3
EXIT_CODES = """exit codes (every command):
  0  done: no findings, every verdict as expected
  1  a finding (check, snapshot --sanitize), a disagreement (fuzz), a hand-off row not behaving as its kind
     must (handoff)
  2  bad input: an unknown option or value, a missing or unwritable file, a device this machine lacks
     (nothing was run)
  3  the script (check, snapshot) or the benchmark (bench) failed: it raised or exited non-zero;
     how it ended is printed last.  It wins over 1: the script's findings are still reported and counted"""


class Progress:
    """A one-line progress display on stderr (rewritten in place on a terminal,
    a line every tenth of the way otherwise)."""

    def __init__(self, total: int, label: str, unit: str, stream: Optional[TextIO] = None) -> None:
        self.total, self.label, self.unit = total, label, unit
        self.out = stream or sys.stderr
        self.start = time.perf_counter()
        self.tty = self.out.isatty()
        self._last_draw = 0.0
        self._last_tenth = -1

    def __call__(self, done: int) -> None:
        now = time.perf_counter()
        tenth = done * 10 // max(1, self.total)
        if self.tty and now - self._last_draw < 0.2 and done < self.total:
            return
        if not self.tty and tenth == self._last_tenth:
            return
        self._last_draw, self._last_tenth = now, tenth
        rate = done / max(now - self.start, 1e-9)
        line = f"{self.label}: {done}/{self.total} {self.unit} ({rate:,.0f}/s)"
        self.out.write(("\r" + line) if self.tty else line + "\n")
        self.out.flush()

    def close(self) -> None:
        if self.tty:
            self.out.write("\n")
            self.out.flush()


def _fuzz(args: argparse.Namespace) -> int:
    from .schedules.fuzz import FuzzConfig, fuzz

    config = FuzzConfig(
        schedules=args.schedules, seed=args.seed, jobs=args.jobs, max_steps=args.max_steps,
        max_streams=args.max_streams, max_events=args.max_events, max_devices=args.max_devices,
        misuse=not args.no_misuse, execute=args.execute, model=args.model,
    )
    if config.model == "native":
        from .lifetime import native_available

        if not native_available():
            print("npu-lifetime: --model native: the native lifetime model is not built "
                  "(pip install -e . with a C++ compiler)", file=sys.stderr)
            return 2
    progress = Progress(config.schedules, "fuzz", "schedules")
    result = fuzz(config, progress=None if args.quiet else progress)
    progress.close()
    which = "the lifetime model" if config.model == "python" else "the native (C++) lifetime model"
    checks = f"{which} vs its independent oracle (happens-before graph)"
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
    from .sanitizer.runner import EXIT_USAGE, CheckError, check_json_path, check_script

    from .flags import env_flag

    try:
        check_json_path(args.json)
        allow_latent = args.allow_latent or env_flag("NPU_LIFETIME_ALLOW_LATENT")
    except (CheckError, ValueError) as err:
        print(f"npu-lifetime check: {err}", file=sys.stderr)
        return EXIT_USAGE
    try:
        _note_options_for_the_script(args)
        result = check_script(
            args.script, args.args, device=args.device, shim=args.shim, policy=args.policy,
            live=not args.no_live, on_race=args.on_race, strict=args.strict,
            allow_latent=allow_latent, suppressions=args.suppressions,
            on_os_exit=lambda result: _report_check(result, args.json),
        )
    except CheckError as err:
        print(f"npu-lifetime check: {err}", file=sys.stderr)
        return EXIT_USAGE
    return _report_check(result, args.json)


def _report_check(result, json_path: Optional[str], command: str = "check", out=None) -> int:
    """What check prints (the report, to ``out``; how the script ended) and
    writes (--json) for a CheckResult, and its exit code.  Also run when the
    script calls os._exit (the process then ends with this code), and by
    snapshot --sanitize."""
    from .sanitizer.runner import write_json

    print(result.report, file=out or sys.stdout)
    write_json(result, json_path)
    if result.script_failed:
        print(f"npu-lifetime {command}: the script {result.ending}", file=sys.stderr)
    elif result.ending:  # os._exit(0): the process ends at that call
        print(f"npu-lifetime {command}: the script {result.ending}: the report above covers what it did until then",
              file=sys.stderr)
    return result.exit_code


SNAPSHOT_LEGEND = (
    "state: live = held by a tensor; pending = freed, reusable once events on other streams fire; deferred = "
    "freed during a graph capture; quarantined = freed and poisoned (debug); cached = free for reuse (waiting: "
    "it still carries use events, a reuse waits on them GPU-side). recorded = record_stream streams; use events "
    "= streams with a live record_use (or noted-use) event; holding = events a freed block still carries."
)


def _snapshot(args: argparse.Namespace) -> int:
    import json

    from .sanitizer.runner import resolve_device
    from .viz.snapshot import SnapshotError, run_demo, run_script, write_pictures

    try:
        _check_snapshot_options(args)
        prefix = None if args.no_files else _output_prefix(args.out, args.script)
        if args.demo:
            outcome = run_demo(args.trace_capacity)
        else:
            _note_options_for_the_script(args)
            outcome = run_script(args.script, args.args, resolve_device(args.device), args.policy, args.sanitize,
                                 args.trace_capacity)
    except SnapshotError as err:
        print(f"npu-lifetime snapshot: {err}", file=sys.stderr)
        return EXIT_USAGE
    rec = outcome.recording
    if prefix is not None:
        try:
            write_pictures(outcome, prefix, args.max_events)
        except OSError as err:
            print(f"npu-lifetime snapshot: cannot write the pictures ({err}); give --out PREFIX somewhere writable",
                  file=sys.stderr)
            return EXIT_USAGE
    document = {"stats": rec.stats, "snapshot": rec.snapshot, "trace": rec.events,
                "shim_findings": rec.shim_findings, "notes": rec.notes}
    if outcome.check is not None:
        document["sanitizer"] = {"findings": outcome.check.json, "failing": len(outcome.check.failing)}
    if args.json:
        print(json.dumps(document, indent=2))
    else:
        _print_snapshot(rec, outcome)
    if outcome.check is not None:  # --sanitize: the sanitizer's summary, and check's exit code
        return _report_check(outcome.check, None, "snapshot", out=sys.stderr if args.json else None)
    if outcome.script_failed:
        print(f"npu-lifetime snapshot: the script {outcome.script_ending}; what it did until then is shown "
              f"(exit {EXIT_SCRIPT_FAILED})", file=sys.stderr)
        return EXIT_SCRIPT_FAILED
    return EXIT_OK


def _check_snapshot_options(args: argparse.Namespace) -> None:
    from .viz.snapshot import SnapshotError

    if args.demo == bool(args.script):
        raise SnapshotError("give a script to run, or --demo (not both)")
    if args.demo:
        for option, given in (("--device", args.device != "auto"), ("--policy", args.policy != "poll"),
                              ("--sanitize", args.sanitize)):
            if given:
                raise SnapshotError(f"{option} is for a script; --demo always runs its hand-off on the simulated "
                                    "runtime (drop one of them)")
    if args.out is not None and args.no_files:
        raise SnapshotError("--out names files to write and --no-files writes none: drop one of them")


def _output_prefix(out: Optional[str], script: Optional[str]) -> str:
    """Where the pictures go, checked before anything runs: PREFIX, or a
    directory to write the default names into."""
    from .viz.snapshot import SnapshotError

    prefix = out or _default_prefix(script)
    if os.path.isdir(prefix):
        prefix = os.path.join(prefix, os.path.basename(_default_prefix(script)))
    parent = os.path.dirname(os.path.abspath(prefix))
    if not os.path.isdir(parent):
        raise SnapshotError(f"cannot write {prefix}.pickle: no directory {parent}; give --out PREFIX in an "
                            "existing directory")
    if not os.access(parent, os.W_OK):
        raise SnapshotError(f"cannot write {prefix}.pickle: {parent} is not writable; give --out PREFIX in a "
                            "writable directory")
    return prefix


def _default_prefix(script: Optional[str]) -> str:
    """Beside the script (``train.py`` -> ``train.snapshot``), or in the
    current directory for the demo."""
    if not script:
        return "npu_lifetime_demo.snapshot"
    return os.path.splitext(script)[0] + ".snapshot"


def _note_options_for_the_script(args: argparse.Namespace) -> None:
    """Everything after the script is the script's (as with python); say so
    when one of those looks like ours."""
    ours = [a.split("=")[0] for a in args.args if a.split("=")[0] in args.own_options]
    if ours:
        print(f"npu-lifetime {args.command}: note: {', '.join(ours)} after the script are passed to the script (its "
              "sys.argv); put npu-lifetime's own options before the script", file=sys.stderr)


def _print_snapshot(rec, outcome) -> None:
    from .viz.snapshot import stats_line

    snap, stats = rec.snapshot, rec.stats
    print(f"{rec.source}: runtime {snap['runtime']}, policy {snap['policy']}")
    print(stats_line(stats))
    print(SNAPSHOT_LEGEND)
    for seg in snap["segments"]:
        print(f"segment {seg['address']:#x} {seg['size']} B device {seg['device']} stream {seg['stream']:#x} "
              f"({seg['pool']})")
        for b in seg["blocks"]:
            extra = ""
            if b["recorded_streams"]:
                extra += " recorded " + ",".join(f"{s:#x}" for s in b["recorded_streams"])
            if b["use_events"]:
                extra += " use events " + ",".join(f"{e['stream']:#x}" for e in b["use_events"])
            if b["held_events"]:
                extra += " holding events of " + ",".join(f"{e['stream']:#x}" for e in b["held_events"])
            print(f"  {b['address']:#x} {b['size']:>10} B {b['state']:<8}{extra}")
    for finding in rec.shim_findings:
        detail = f": {finding['detail']}" if finding.get("detail") else ""
        print(f"shim finding: {finding.get('kind')} ({finding.get('op')}) at {finding.get('address') or 0:#x}{detail}")
    for note in rec.notes:
        print(f"note: {note}")
    if outcome.pickle_path:
        print(f"wrote {outcome.pickle_path}: drop it on https://pytorch.org/memory_viz (each block's streams and "
              "events are in its stack frames; record_use etc. are in the event list)")
        print(f"wrote {outcome.html_path}: the timeline, one lane per stream (open it in a browser)")


def _handoff(args: argparse.Namespace) -> int:
    import torch

    from .handoff import SimHandoffDevice, TorchHandoffDevice, table

    if args.device == "cuda" and not torch.cuda.is_available():
        print("npu-lifetime handoff: --device cuda needs a CUDA GPU and none is available; "
              "use --device sim (the default) on this machine", file=sys.stderr)
        return EXIT_USAGE
    missing = _npu_missing() if args.device == "npu" else None
    if missing:
        print(f"npu-lifetime handoff: --device npu needs torch_npu and an Ascend NPU; {missing}: use --device sim "
              "(the default) on this machine", file=sys.stderr)
        return EXIT_USAGE
    if args.fsdp2 == "yes" and torch.cuda.device_count() < 2:
        print(f"npu-lifetime handoff: --fsdp2 yes needs 2 CUDA GPUs (found {torch.cuda.device_count()})",
              file=sys.stderr)
        return EXIT_USAGE
    if args.device == "sim" and _handoff_bytes(args) > _host_memory_bytes():
        print(f"npu-lifetime handoff: --width {args.width} and --layers {args.layers} need about "
              f"{_handoff_bytes(args) / 2 ** 30:,.1f} GiB of host memory on --device sim; this machine has "
              f"{_host_memory_bytes() / 2 ** 30:,.1f} GiB: use a smaller --width or fewer --layers", file=sys.stderr)
        return EXIT_USAGE
    if args.device in ("cuda", "npu"):
        from .shim.install import InstallError, install

        try:
            install(args.device)
        except InstallError as err:
            print(f"npu-lifetime handoff: --device {args.device}: {err}", file=sys.stderr)
            return EXIT_USAGE
        device = TorchHandoffDevice(args.device)
    else:
        device = SimHandoffDevice()
    try:
        rows, ok = table.handoff_table(device, layers=args.layers, width=args.width, steps=args.steps)
    except (MemoryError, RuntimeError) as err:
        if not isinstance(err, MemoryError) and "allocate" not in str(err) and "out of memory" not in str(err):
            raise
        print(f"npu-lifetime handoff: out of memory with --width {args.width} (each buffer {args.width}x"
              f"{args.width} fp32, {4 * args.width ** 2 / 2 ** 20:,.1f} MiB) and --layers {args.layers}: use a "
              "smaller --width or fewer --layers", file=sys.stderr)
        return EXIT_USAGE
    print(f"FSDP-style hand-off, {args.layers} layers, {args.width}x{args.width} buffers, device {device.name}, "
          "under the lifetime sanitizer")
    print("\n".join("  " + c for c in table.columns(device.name, getattr(device, "late_read_delay", 0))))
    print(table.format_table(rows, device.name))
    print(table.summary(rows, device.name))
    fsdp2_ok = _handoff_fsdp2(args)
    return EXIT_OK if ok and fsdp2_ok else EXIT_FINDINGS


def _npu_missing() -> Optional[str]:
    """Why this machine cannot run on an NPU (torch_npu missing, or no NPU
    seen), or None."""
    import torch

    try:
        import torch_npu  # noqa: F401
    except ImportError as err:
        return f"torch_npu is not installed here ({err})"
    if not torch.npu.is_available():
        return "torch_npu sees no NPU"
    return None


def _handoff_bytes(args: argparse.Namespace) -> int:
    """About what the harness holds at once: a shard per layer, the
    activations, the reduced gradient and two buffers in flight (fp32)."""
    return (args.layers + 4) * 4 * args.width ** 2


def _host_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _handoff_fsdp2(args: argparse.Namespace) -> bool:
    import subprocess

    import torch

    from .handoff import table

    gpus = torch.cuda.device_count()
    if args.fsdp2 == "no" or (args.fsdp2 == "auto" and gpus < 2):
        if args.fsdp2 == "auto":
            print(f"\nFSDP2 migration table: skipped, it needs 2 CUDA GPUs (found {gpus}); "
                  "on a machine with them: npu-lifetime handoff --fsdp2 yes")
        return True
    print("\ntorch FSDP2 (fully_shard, 2 GPUs, NCCL), shipped vs migrated to record_use, shim allocator")
    print("\n".join("  " + c for c in table.FSDP2_COLUMNS))
    try:
        reports = table.fsdp2_reports()
    except (RuntimeError, FileNotFoundError, subprocess.TimeoutExpired) as err:
        print(f"npu-lifetime handoff: {err}", file=sys.stderr)
        return False
    print(table.format_fsdp2_table(reports))
    return not any(r.get("errors") for r in reports)


def _bench(args: argparse.Namespace) -> int:
    from pathlib import Path

    scripts = Path(__file__).resolve().parent.parent / "benchmarks"
    available = {p.stem[len("bench_"):]: p for p in sorted(scripts.glob("bench_*.py"))}
    if args.name is None or args.name not in available:
        if args.name is not None:
            print(f"npu-lifetime: no benchmark {args.name!r}", file=sys.stderr)
        if not available:
            print("npu-lifetime: no benchmarks/ here (they ship with a repository checkout, not a wheel)",
                  file=sys.stderr)
            return EXIT_USAGE
        out = sys.stdout if args.name is None else sys.stderr
        print("benchmarks (npu-lifetime bench NAME [--help]):", file=out)
        for name, path in available.items():
            print(f"  {name:<12} {_summary(path)}", file=out)
        return EXIT_OK if args.name is None else EXIT_USAGE
    return _run_benchmark(args.name, str(available[args.name]), args.args)


def _run_benchmark(name: str, path: str, argv: list) -> int:
    """A benchmark's own argument errors (argparse: 2) pass through; any other
    failure is exit 3 with one line saying how it ended."""
    from . import user_script

    ending = user_script.run(path, argv)
    if not ending.failed:
        return EXIT_OK
    if ending.how == f"exited with status {EXIT_USAGE}":
        return EXIT_USAGE
    print(f"npu-lifetime bench {name}: the benchmark {ending.how} (exit {EXIT_SCRIPT_FAILED})", file=sys.stderr)
    return EXIT_SCRIPT_FAILED


def _summary(path) -> str:
    """The first sentence of a script's docstring."""
    import ast

    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    paragraph = " ".join(doc.split("\n\n")[0].split())
    sentence = paragraph.split(". ")[0].rstrip(".")
    return sentence if len(sentence) <= 90 else sentence[:87].rsplit(" ", 1)[0] + " ..."


def _parser() -> argparse.ArgumentParser:
    from . import __version__
    from .shim.api import DEFAULT_POLICY, POLICIES

    parser = argparse.ArgumentParser(
        prog="npu-lifetime",
        description="Cross-stream lifetime checking for PyTorch (CUDA, Ascend NPU, simulated).",
        epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"npu-lifetime {__version__}")
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
    p.add_argument("--model", default="python", choices=["python", "native"],
                   help="the lifetime model checked: python (the reference, default) or native (its C++ version)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress line")
    p.set_defaults(run=_fuzz)

    p = sub.add_parser(
        "check", help="run a script under the lifetime sanitizer",
        description="Runs SCRIPT under the lifetime sanitizer and reports its findings. Exit codes: "
                    "0 no finding fails the check, 1 findings fail it: every data race and reuse race, every "
                    "uncovered free (latent or actual: the report says which, and why a latent one did not "
                    "corrupt this run), invalid frees and uses after free; known-safe patterns are silenced only "
                    "explicitly (--suppressions, --allow-latent); 2 bad usage (no such script, a device this "
                    "machine lacks, a malformed suppressions file), 3 the script itself failed. Options go before "
                    "SCRIPT; what follows SCRIPT is the script's own arguments (its sys.argv, as with python): one "
                    "of the options below written after SCRIPT is passed to the script, and a note on stderr says so. "
                    "A script that calls os._exit is reported up to that call; the process ends there, with the "
                    "exit code above.",
    )
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "npu", "sim"])
    p.add_argument("--shim", action="store_true", help="install the allocator shim first (cuda/npu)")
    p.add_argument("--policy", default=DEFAULT_POLICY, choices=sorted(POLICIES),
                   help=f"the shim's reuse policy with --shim (default {DEFAULT_POLICY})")
    p.add_argument("--json", metavar="FILE", help="also write the findings as JSON")
    p.add_argument("--no-live", action="store_true", help="leave out storages still alive at the end")
    p.add_argument("--on-race", default="collect", choices=["collect", "warn", "raise"])
    p.add_argument("--suppressions", metavar="FILE",
                   help="silence known-safe findings: lines KIND:fun:GLOB or KIND:src:GLOB (default "
                        "$NPU_LIFETIME_SUPPRESSIONS; see the README)")
    p.add_argument("--allow-latent", action="store_true",
                   help="let latent uncovered frees pass (no reuse raced with them in this run); a free only the "
                        "shim's hold kept safe still fails (also NPU_LIFETIME_ALLOW_LATENT=1)")
    p.add_argument("--strict", action="store_true",
                   help="also fail on uses of storages still alive at the end that a free now would leave "
                        "uncovered")
    p.add_argument("script")
    p.add_argument("args", nargs=argparse.REMAINDER)
    p.set_defaults(run=_check, own_options=_option_strings(p))

    p = sub.add_parser(
        "snapshot", help="run a script with the shim recording; write a memory-viewer pickle and an HTML timeline",
        description="Runs SCRIPT with the allocator shim recording its trace, prints the blocks at the end, and "
                    "writes PREFIX.pickle (PyTorch's memory viewer format) and PREFIX.html (a timeline of block "
                    "lives per stream). Options go before SCRIPT; what follows SCRIPT is the script's own "
                    "arguments. If the script fails the pictures are still written.",
        epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "npu", "sim"])
    p.add_argument("--policy", default="poll", choices=sorted(POLICIES))
    p.add_argument("--demo", action="store_true", help="run a built-in hand-off on the simulated runtime instead")
    p.add_argument("--sanitize", action="store_true",
                   help="also run the lifetime sanitizer as check does: its findings are drawn, its report is printed "
                        "last (on stderr with --json, whose JSON gains them) and the exit code is check's")
    p.add_argument("--out", metavar="PREFIX", help="where to write PREFIX.pickle and PREFIX.html, or a directory "
                                                   "to write them into (default: beside the script, "
                                                   "SCRIPT.snapshot.*)")
    p.add_argument("--no-files", action="store_true", help="print only; write no pickle or HTML")
    p.add_argument("--trace-capacity", type=_at_least_one, default=1 << 20,
                   help="events the shim keeps (default 1048576)")
    p.add_argument("--max-events", type=_at_least_one, default=4000,
                   help="trace events drawn in the timeline (the latest)")
    p.add_argument("--json", action="store_true", help="print the state and trace as JSON instead of text")
    p.add_argument("script", nargs="?")
    p.add_argument("args", nargs=argparse.REMAINDER)
    p.set_defaults(run=_snapshot, own_options=_option_strings(p))

    p = sub.add_parser("handoff", help="run the FSDP-style hand-off harness (recipe vs record_use vs record_stream), "
                                       "and torch's FSDP2 migrated to record_use on 2 GPUs",
                       epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="sim", choices=["sim", "cuda", "npu"],
                   help="sim: the simulated device (default); cuda, npu: that device's streams with the shim "
                        "installed (npu: torch_npu)")
    p.add_argument("--layers", type=_at_least_two, default=6,
                   help="layers of the schedule (at least 2: a broken hand-off's stash is released by the next "
                        "layer's all-gather; with one layer only after the device is synchronised, when it is safe)")
    p.add_argument("--width", type=_at_least_one, default=64)
    p.add_argument("--steps", type=_at_least_one, default=5, help="steps per run; step ms is their median (default 5)")
    p.add_argument("--fsdp2", default="auto", choices=["auto", "yes", "no"],
                   help="also run torch's FSDP2 shipped vs migrated (auto: when 2 CUDA GPUs are present)")
    p.set_defaults(run=_handoff)

    p = sub.add_parser("corpus", help="publicly reported cross-stream bugs: the sanitizer's verdict on each "
                                      "buggy and fixed form, and on a GPU the data and compute-sanitizer's",
                       epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="sim", choices=["sim", "cuda", "npu"])
    p.add_argument("--case", action="append", help="only this case (repeatable; default: all)")
    p.add_argument("--corruption", action="store_true",
                   help="cuda, npu: also run each form under the shim's debug mode with a slow kernel (a process "
                        "of its own) and say whether its data came out intact")
    p.add_argument("--compute-sanitizer", action="store_true",
                   help="cuda: also run each form under compute-sanitizer's stream-ordered race tracking")
    p.add_argument("--json", help="also write the table as JSON to this file")
    p.set_defaults(run=_corpus)

    p = sub.add_parser("bench", help="run a benchmark script from benchmarks/ (no NAME: list them)",
                       description="Runs benchmarks/bench_NAME.py with ARGS (npu-lifetime bench NAME --help: its "
                                   "options).", epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", nargs="?")
    p.add_argument("args", nargs=argparse.REMAINDER)
    p.set_defaults(run=_bench)
    return parser


def _corpus(args: argparse.Namespace) -> int:
    import json
    import subprocess

    from .corpus import case_modules
    from .corpus import table as corpus_table

    known = case_modules()
    unknown = [name for name in args.case or () if name not in known]
    problem = (f"no case {', '.join(unknown)} (cases: {', '.join(known)})" if unknown else
               "--corruption runs on cuda or npu" if args.corruption and args.device == "sim" else
               "--compute-sanitizer runs on cuda" if args.compute_sanitizer and args.device != "cuda" else
               _device_missing(args.device))
    if problem:
        print(f"npu-lifetime corpus: {problem}", file=sys.stderr)
        return EXIT_USAGE
    progress = Progress(len(args.case or known), "corpus", "cases")
    rows = corpus_table.build(args.device, args.case, progress=lambda done, total, name: progress(done))
    progress.close()
    if args.corruption:
        command = [sys.executable, "-m", "npu_lifetime.corpus.corruption", "--device", args.device]
        done = subprocess.run(command + [f"--case={r.case.name}" for r in rows], capture_output=True, text=True)
        if done.returncode != 0:
            print(f"npu-lifetime corpus: the corruption run failed:\n{done.stdout}{done.stderr}", file=sys.stderr)
            return EXIT_SCRIPT_FAILED
        seen = json.loads(done.stdout.strip().splitlines()[-1])
        for row in rows:
            row.corruption = seen.get(row.case.name)
    if args.compute_sanitizer:
        from .corpus import oracle

        counts, logs = oracle.run([(r.case.name, form) for r in rows for form in r.case.forms])
        for row in rows:
            row.oracle = counts.get(row.case.name)
        if args.json:  # compute-sanitizer's own words, beside the table
            with open(args.json + ".compute-sanitizer.log", "w") as out:
                for name, forms in logs.items():
                    for form, log in forms.items():
                        out.write(f"==== {name} [{form}]\n{log}\n")
    print(corpus_table.render(rows, args.device))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(corpus_table.as_json(rows), out, indent=2)
    return EXIT_OK if corpus_table.all_as_expected(rows) else EXIT_FINDINGS


def _device_missing(device: str) -> str:
    """Why ``device`` cannot run here, or '' (the sanitizer backend's own check)."""
    from .sanitizer import DeviceUnavailable
    from .sanitizer.backends import backend_for

    try:
        backend_for(device).check_available()
    except DeviceUnavailable as err:
        return str(err)
    return ""


def _at_least_one(text: str) -> int:
    """An argparse type: a whole number >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, not {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _at_least_two(text: str) -> int:
    """An argparse type: a whole number >= 2."""
    value = _at_least_one(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"must be at least 2, not {value}")
    return value


def _option_strings(parser: argparse.ArgumentParser) -> tuple:
    # argparse has no public list of a parser's options; its actions hold them
    return tuple(option for action in parser._actions for option in action.option_strings)


def main(argv: Optional[list] = None) -> int:
    # a CPU torch without numpy says so at import; it is not ours to report
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exit_:  # argparse: --help, --version (0) and bad options (2, its message printed)
        return exit_.code
    least = {"schedules": 1, "jobs": 1, "max_steps": 1, "max_streams": 1, "max_events": 0, "max_devices": 1}
    for name in least if args.command == "fuzz" else ():  # before a worker fails on it (exit 1 read as a finding)
        if getattr(args, name) < least[name]:
            print(f"npu-lifetime: --{name.replace('_', '-')} must be at least {least[name]}, not {getattr(args, name)}",
                  file=sys.stderr)
            return EXIT_USAGE
    from . import npu_runtime

    stop = npu_runtime.prepare(args.command, getattr(args, "device", None), argv)  # before torch is imported
    if stop is not None:
        return stop
    from .shim.libnpl import ShimNotBuilt

    try:
        return args.run(args)
    except ShimNotBuilt as err:  # every command but bench and fuzz needs the shim
        print(f"npu-lifetime {args.command}: {err}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
