"""``npu-lifetime handoff``: every hand-off of the harness on one device,
as a table of findings, peak memory, step time, output agreement, what the
simulated executor shows of a late read and what a late read sees in the
shim's debug mode (on a real device: the device's own run, every consumer
slowed before its last read); and, with 2 GPUs, the same for torch's FSDP2
migrated to record_use."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from ..shim import api as shim
from .harness import check_arguments, run_handoff
from .recipes import BROKEN, CORRECT, BrokenEventTooLate, Handoff, RecordStreamHandoff, RecordUseHandoff
from .replay import replay

COLUMNS = (
    "hand-off: how the buffer goes from the stream that allocated it to the stream that reads it last",
    "policy: the shim's reuse policy for blocks whose events are pending",
    "findings: what the lifetime sanitizer reported for the run (- for none)",
    "peak KiB: the shim's peak active memory (live + freed but waiting on events)",
    "step ms: median host time per step over the run's steps (--steps, default 5), device synchronised, and "
    "their range (fastest-slowest)",
    "outputs: the run's outputs compared with the recipe's (same / DIFFER)",
    "late read: the same hooks replayed on the simulated executor with the consumer delayed "
    "(corrupts = the last read sees the next owner's data)",
    "debug: the same hooks on the shim's simulated runtime in debug mode, the last read running after the "
    "free (poison = it reads NaN, on every run; data = it reads its data)",
    "verdict: ok when the row behaves as its kind must; the note says why",
)
_DEVICE_DEBUG = (
    "debug: what the device itself did: the harness run again on the {device} with the shim in debug mode "
    "(a block is filled with NaN once really free, before any next owner gets it) and every consumer sleeping "
    "{delay:,} cycles (torch.{device}._sleep) before its last read (poison = a last read saw NaN: its buffer was "
    "freed under it; other = the outputs differ without NaN; data = the outputs are the recipe's)"
)


# On the simulated device a step is Python host work only: its time varies
# tenfold between runs and says nothing about a hand-off's cost on a device.
_NOT_MEASURED_ON_SIM = ("step time: not shown on the simulated device (its steps are Python host work whose time "
                        "varies tenfold between runs: not a measurement); run --device cuda or npu for it")


def columns(device_name: str = "sim", delay: int = 0) -> tuple:
    """What each column means, for a table of ``device_name``; ``delay``:
    the consumers' sleep of the device's debug run."""
    if device_name == "sim":
        return tuple(c for c in COLUMNS if not c.startswith("step ms:")) + (_NOT_MEASURED_ON_SIM,)
    return tuple(_DEVICE_DEBUG.format(device=device_name, delay=delay) if c.startswith("debug:") else c
                 for c in COLUMNS)


@dataclass
class Row:
    kind: str  # correct | safe by design | broken
    handoff: str
    policy: str
    findings: list
    peak_bytes: int
    step_ms: Optional[float]
    step_range_ms: Optional[tuple]
    same_outputs: bool
    corrupts: bool
    debug_read: str  # what the late read saw in debug mode: poison.py on sim, the device's own run on a device
    ok: bool
    note: str


def _policies(cls) -> tuple:
    if cls not in (RecordStreamHandoff, RecordUseHandoff):
        return ("poll",)
    names = ["poll", "stream_wait"] + [p for p in shim.POLICIES if p not in ("poll", "stream_wait")]
    return tuple(names)


def _kind(cls) -> str:
    return "correct" if cls in CORRECT else "safe by design" if cls is BrokenEventTooLate else "broken"


def _judge(kind: str, findings: list, same: bool, corrupts: bool, debug_read: str = "-") -> tuple:
    """(ok, note) for one run of a hand-off of ``kind``."""
    poisoned = debug_read == "poison"
    if debug_read != "-" and poisoned != (kind == "broken"):
        return False, "debug mode read the wrong thing" if poisoned else "debug mode did not poison a broken hand-off"
    if kind == "correct":
        ok = not findings and same and not corrupts
        return ok, "clean, same outputs, late read safe" if ok else "a correct hand-off misbehaved"
    if kind == "safe by design":
        ok = not findings and same and not corrupts
        return ok, ("no finding, by design: the owner waits on an event recorded at the drop, after unrelated "
                    "consumer work; safe, only later than needed (owner stall time, not memory)"
                    if ok else "expected safe and clean")
    ok = "uncovered_free" in findings and set(findings) <= {"uncovered_free", "reuse_race"} and corrupts
    raced = "reuse_race" in findings
    return ok, ("caught: the free leaves the last read uncovered" +
                ("; the next owner's write raced with it (actual)" if raced else " (latent here)") +
                "; the delayed read is corrupted" if ok else "a broken hand-off went unreported or did not corrupt")


def _same(outputs: list, reference: list) -> bool:
    return all(torch.equal(a, b) for a, b in zip(outputs, reference))


def device_late_read(device, handoff_class, reference: list, layers: int, width: int, steps: int,
                     delay: int) -> str:
    """What a real device's late reads see: the harness with ``handoff_class``
    on ``device`` with the shim in debug mode and every consumer sleeping
    ``delay`` cycles before its last read (the mechanism of the GPU debug
    tests, tests/platforms/gpu_programs/handoff_programs.py ``debug``).  A buffer freed
    under its last read is poisoned first, so that read sees NaN: "poison";
    outputs that differ from ``reference`` without NaN: "other"; else "data"."""
    was_debug = shim.debug()
    shim.set_policy("poll")
    shim.set_debug(True)
    try:
        r = run_handoff(device, handoff_class, layers=layers, width=width, steps=steps, sanitize=False,
                        consumer_delay=delay)
    finally:
        shim.set_debug(was_debug)
    if any(bool(torch.isnan(t).any()) for t in r.outputs):
        return "poison"
    return "data" if _same(r.outputs, reference) else "other"


def handoff_table(device, layers: int = 6, width: int = 64, steps: int = 1, late_read_delay=None) -> tuple:
    """Returns (rows, ok): ok when every row behaves as its kind must.  On a
    real device the debug column is the device's own run
    (``device_late_read``), each consumer sleeping ``late_read_delay`` cycles
    (default: the device's ``late_read_delay``)."""
    from .poison import late_read

    check_arguments(device, Handoff, layers=layers, width=width, steps=steps)
    if layers < 2:  # with one, every stash is released after the device synchronised: the broken ones are safe
        raise ValueError(f"layers must be at least 2 for the table (a broken hand-off's stash is released by the "
                         f"next layer's all-gather), not {layers}")
    on_sim = device.name == "sim"
    delay = 0 if on_sim else device.late_read_delay if late_read_delay is None else late_read_delay
    if not on_sim:
        check_arguments(device, Handoff, late_read_delay=delay)
    rows, reference = [], None
    for cls in CORRECT + BROKEN:
        corrupts, kind = replay(cls).corrupted, _kind(cls)
        if on_sim:
            shim.reset()
            debug_read = late_read(cls).saw
        runs = []
        for policy in _policies(cls):
            if on_sim:
                shim.reset()
                shim.select_runtime("sim")
            shim.set_policy(policy)
            runs.append((policy, run_handoff(device, cls, layers=layers, width=width, steps=steps)))
            reference = reference or runs[-1][1].outputs
        if not on_sim:
            debug_read = device_late_read(device, cls, reference, layers, width, steps, delay)
        for policy, r in runs:
            same = _same(r.outputs, reference)
            ok, note = _judge(kind, r.finding_kinds, same, corrupts, debug_read)
            rows.append(Row(kind, r.handoff, policy, r.finding_kinds, r.peak_active_bytes, r.step_median_ms,
                            r.step_range_ms, same, corrupts, debug_read, ok, note))
    return rows, all(row.ok for row in rows)


def _step(r: Row) -> str:
    if r.step_ms is None:
        return "-"
    fastest, slowest = r.step_range_ms
    return f"{r.step_ms:.2f} ({fastest:.2f}-{slowest:.2f})"


# (header, cell, right-aligned); the verdict, last, is not padded
_CELLS = (
    ("hand-off", lambda r: r.handoff, False),
    ("policy", lambda r: r.policy, False),
    ("findings", lambda r: ", ".join(r.findings) or "-", False),
    ("peak KiB", lambda r: f"{r.peak_bytes / 1024:.0f}", True),
    ("step ms", _step, True),
    ("outputs", lambda r: "same" if r.same_outputs else "DIFFER", True),
    ("late read", lambda r: "corrupts" if r.corrupts else "safe", True),
    ("debug", lambda r: r.debug_read, True),
)


def format_table(rows: list, device_name: str = "sim") -> str:
    """One line per row, each column as wide as its widest cell; on the
    simulated device without the step time (not a measurement there)."""
    shown = tuple(c for c in _CELLS if device_name != "sim" or c[0] != "step ms")
    cells = [[cell(r) for _, cell, _ in shown] for r in rows]
    widths = [max([len(head)] + [len(line[i]) for line in cells]) for i, (head, _, _) in enumerate(shown)]

    def line(values: list, verdict: str) -> str:
        padded = [v.rjust(w) if right else v.ljust(w) for v, w, (_, _, right) in zip(values, widths, shown, strict=True)]
        return "  ".join(padded) + "  " + verdict

    lines = [line([head for head, _, _ in shown], "verdict")]
    lines += [line(values, f"{'ok' if r.ok else 'UNEXPECTED'}: {r.note}") for values, r in zip(cells, rows, strict=True)]
    return "\n".join(lines)


def summary(rows: list, device_name: str = "sim") -> str:
    bad = [r for r in rows if not r.ok]
    if bad:
        return "UNEXPECTED: " + "; ".join(f"{r.handoff} ({r.policy}): {r.note}" for r in bad)
    correct = len({r.handoff for r in rows if r.kind == "correct"})
    caught = len({r.handoff for r in rows if r.kind == "broken"})
    by_design = [r.handoff for r in rows if r.kind == "safe by design"]
    text = (f"as expected: {correct} correct hand-offs clean with the recipe's outputs; {caught} broken ones "
            "reported by the sanitizer and corrupted on the executor")
    if any(r.debug_read == "poison" for r in rows) and device_name == "sim":
        text += "; in debug mode the broken ones read NaN on every run"
    elif any(r.debug_read == "poison" for r in rows):
        text += (f"; on the {device_name} itself, with slow consumers and the shim in debug mode, the broken ones' "
                 "last reads saw their freed buffers (NaN) and the others their data")
    if by_design:
        text += f"; '{by_design[0]}' has no finding because it is safe (it only waits longer than needed)"
    return text


# -- FSDP2 on 2 GPUs -----------------------------------------------------------------------------------
FSDP2_COLUMNS = (
    "mode: FSDP2 as shipped (recipe), migrated to record_use, or a broken migration",
    "losses: the run's losses compared with the shipped FSDP2's (same / DIFFER)",
    "peak MiB: peak active memory, rank 0; step ms: median step, rank 0, and its ratio to the shipped FSDP2",
    "sanitizer: findings other than FSDP2's own latent gradient frees at zero_grad (- for none)",
    "under pressure: slow consumer + allocation pressure on the producer stream: corrupted or not",
)


def fsdp2_reports(allocator: str = "shim", timeout: float = 900) -> list:
    """Runs examples/fsdp2_record_use.py on 2 GPUs; the per-rank reports."""
    root = Path(__file__).resolve().parent.parent.parent
    script = root / "examples" / "fsdp2_record_use.py"
    if not script.exists():
        raise FileNotFoundError(f"{script} is missing: the FSDP2 table needs a repository checkout")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as out:
        env = dict(os.environ, PYTHONPATH=str(root), PYTHONWARNINGS="ignore", NCCL_NVLS_ENABLE="0")
        done = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={port}",
             str(script), "--device", "cuda", "--allocator", allocator, "--phases", "timing,sanitizer,pressure",
             "--json", out], capture_output=True, text=True, env=env, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"the FSDP2 run failed:\n{done.stderr[-3000:]}")
        return [json.loads(Path(out, f"rank{r}.json").read_text()) for r in (0, 1)]


def _kinds_counted(groups: dict) -> str:
    """``{"uncovered_free: <where>": n, ...}`` -> ``uncovered_free x8``: one
    count per kind, over its groups."""
    kinds: dict = {}
    for label, n in groups.items():
        kind = label.split(":")[0]
        kinds[kind] = kinds.get(kind, 0) + n
    return ", ".join(f"{kind} x{n}" for kind, n in kinds.items())


def format_fsdp2_table(reports: list) -> str:
    from ..fsdp2 import MODES, RECIPE

    r0 = reports[0]
    timing, sanitizer, pressure = r0.get("timing", {}), r0.get("sanitizer", {}), r0.get("pressure", {})
    lines = [f"{'mode':<42} {'losses':>7} {'peak MiB':>9} {'step ms':>8} {'x':>6} {'sanitizer':<28} under pressure"]
    base = timing.get(RECIPE, {})
    for mode in MODES:
        t, s, p = timing.get(mode, {}), sanitizer.get(mode, {}), pressure.get(mode, {})
        losses = t.get("losses") or s.get("losses")
        same = "-" if not losses else ("same" if losses[:3] == (base.get("losses") or [])[:3] else "DIFFER")
        peak = f"{t['peak_active_bytes'] / 2**20:9.1f}" if "peak_active_bytes" in t else f"{'-':>9}"
        step = t.get("step_ms_median")
        ratio = f"{step / base['step_ms_median']:6.3f}" if step and base.get("step_ms_median") else f"{'-':>6}"
        found = s.get("findings", {}).get("unexpected")
        san = "not run" if found is None else _kinds_counted(found) or "-"
        press = "not run" if not p else ("CORRUPTED" if p["corrupted"] else "intact")
        step_text = f"{step:8.2f}" if step else f"{'-':>8}"
        lines.append(f"{mode:<42} {same:>7} {peak} {step_text} {ratio} {san:<28} {press}")
    errors = {k: v.strip().splitlines()[-1] for r in reports for k, v in r.get("errors", {}).items()}
    if errors:
        lines.append(f"phases that failed: {errors}")
    return "\n".join(lines)
