"""``npu-lifetime snapshot``: run a script (or the built-in demo) with the
shim recording, then write the memory-viewer pickle and the HTML timeline."""
from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import Optional

from .. import user_script
from . import lives as lives_mod
from . import memory_viz, storage_lines, timeline
from .recorder import Recorder, Recording

SIM_SCRIPT_NOTE = (
    "On the simulated device (no CUDA or NPU here) a script's tensors are CPU tensors, which the shim does not "
    "allocate: only direct npu_lifetime.shim calls appear. Run `npu-lifetime snapshot --demo` for a built-in "
    "hand-off on simulated streams, or run the script on a CUDA or NPU machine."
)
SIM_SANITIZED_NOTE = (
    "On the simulated device (no CUDA or NPU here) a script's tensors are CPU tensors, which the shim does not "
    "allocate, so the block timeline is empty; the storages the sanitizer reported on are drawn under "
    "'What the sanitizer saw', from what it saw of each (allocation, uses per stream, free, the finding)."
)


class SnapshotError(RuntimeError):
    """Bad input to the snapshot command (exit 2)."""


@dataclass
class Outcome:
    recording: Recording
    script_failed: bool
    pickle_path: Optional[str] = None
    html_path: Optional[str] = None
    script_ending: str = ""  # how a failed script ended ("raised ValueError: boom", "exited with status 3")
    check: object = None  # with --sanitize: the run's CheckResult (sanitizer/runner.py), reported as check does


def run_demo(capacity: int) -> Outcome:
    from ..shim import api
    from . import demo

    api.select_runtime("sim")
    api.reset()  # a fresh process: nothing of ours is allocated yet
    recorder = Recorder(capacity).start()
    demo.run()
    recording = recorder.stop("the built-in hand-off demo (npu_lifetime/viz/demo.py) on the simulated runtime")
    recording.stream_names = dict(demo.STREAM_NAMES)
    return Outcome(recording, script_failed=False)


def run_script(script: str, args: list, device: str, policy: str, sanitize: bool, capacity: int) -> Outcome:
    """``device`` is resolved (cuda, npu or sim); a device the machine lacks
    is a SnapshotError, never a silent run on another."""
    try:
        user_script.check_path(script)
    except user_script.ScriptPathError as err:
        raise SnapshotError(str(err)) from None
    _prepare_device(device, policy)
    recorder = Recorder(capacity).start()
    check = None
    try:
        if sanitize:  # the script runs as check runs it: the same sanitizer settings, verdicts and exit code
            from ..sanitizer.runner import CheckError, check_script

            try:
                check = check_script(script, args, device=device)
            except CheckError as err:
                raise SnapshotError(str(err)) from None
            ending = user_script.Ending(check.script_failed, check.ending)
        else:
            ending = _run_path(script, args)
    except BaseException:
        recorder.stop("a run that did not start")
        raise
    recording = recorder.stop(f"{script} on {device}")
    if check is not None:
        recording.sanitizer_findings = _sanitizer_findings(check)
        lines = storage_lines.from_findings(check.findings, check.sanitizer.report)
        recording.storages_html = storage_lines.render(lines, check.sanitizer.describe)
    if device == "sim" and recording.block_count == 0:
        recording.notes.append(SIM_SCRIPT_NOTE if check is None else SIM_SANITIZED_NOTE)
    return Outcome(recording, ending.failed, script_ending=ending.how, check=check)


def _prepare_device(device: str, policy: str) -> None:
    from ..shim import api

    if device == "sim":
        api.select_runtime("sim")
        api.set_policy(policy)
        return
    from ..shim.install import InstallError, install

    try:
        install(device, policy)
    except InstallError as err:
        raise SnapshotError(f"--device {device}: {err}") from err


def _run_path(script: str, args: list) -> user_script.Ending:
    """Runs the script as __main__ (a failure's traceback is printed; what
    it recorded is still drawn)."""
    try:
        return user_script.run(script, args)
    finally:
        gc.collect()


def _sanitizer_findings(check) -> list:
    """The timeline's rows: each finding of the check with its report."""
    out = []
    sanitizer = check.sanitizer
    for f in check.findings:
        stream = getattr(f, "usage_stream", None) or getattr(getattr(f, "access", None), "stream", None)
        device, handle = stream if isinstance(stream, tuple) else (0, None)
        out.append(timeline.SanitizerFinding(sanitizer.report([f]), getattr(f, "address", None), device, handle))
    return out


def write_pictures(outcome: Outcome, prefix: str, max_events: int) -> None:
    """``prefix``.pickle (PyTorch's memory viewer) and ``prefix``.html."""
    rec = outcome.recording
    lives = lives_mod.build(rec.events, rec.shim_findings) if rec.events is not None else None
    data = memory_viz.build(rec.snapshot, lives, rec.frames, source=rec.source)
    problems = memory_viz.replay_problems(data)
    if problems:  # a trace that does not lead to the final state would break the viewer: keep the state only
        data["device_traces"] = [[] for _ in data["device_traces"]]
        rec.notes.append(f"The trace does not replay onto the final state ({problems[0]}); the pickle holds the "
                         "final state only.")
    outcome.pickle_path, outcome.html_path = f"{prefix}.pickle", f"{prefix}.html"
    memory_viz.write(outcome.pickle_path, data)
    page = timeline.Page(source=rec.source, facts=_facts(rec), notice=" ".join(rec.notes),
                         stream_names=rec.stream_names)
    empty = lives_mod.build([], rec.shim_findings)
    html = timeline.render(lives if lives is not None else empty, page, tuple(rec.sanitizer_findings), max_events,
                           rec.storages_html)
    with open(outcome.html_path, "w", encoding="utf-8") as f:
        f.write(html)


def stats_line(stats: dict) -> str:
    """The shim's state at the end in one line (torch-style stat keys)."""
    def cur(name: str) -> int:
        return stats.get(f"{name}.all.current", 0)

    line = (f"live {cur('allocation')} blocks / {cur('allocated_bytes')} B, pending {cur('pending')} / "
            f"{cur('pending_bytes')} B, waiting {cur('waiting')} / {cur('waiting_bytes')} B")
    if cur("quarantined"):
        line += f", quarantined {cur('quarantined')} / {cur('quarantined_bytes')} B"
    return line + f", reserved {cur('reserved_bytes')} B (peak {stats.get('reserved_bytes.all.peak', 0)} B)"


def _facts(rec: Recording) -> list:
    s = rec.stats
    return [
        ("runtime, policy", f"{rec.snapshot['runtime']}, {rec.snapshot['policy']}"
                            + (", debug (poison + quarantine)" if rec.snapshot.get("debug") else "")),
        ("trace", "not available" if rec.events is None else f"{len(rec.events)} events, {rec.dropped} dropped"),
        ("at the end", stats_line(s)),
        ("peak active", f"{s.get('active_bytes.all.peak', 0)} B (live + freed blocks waiting on events)"),
        ("findings", f"shim {len(rec.shim_findings)}, sanitizer {len(rec.sanitizer_findings)}"),
    ]
