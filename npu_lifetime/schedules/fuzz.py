"""``npu-lifetime fuzz``: random schedules through the lifetime model and
its independent oracle (and, with ``execute``, the simulated device).

Schedules come from ``random`` bytes interpreted by ``build_schedule`` (no
hypothesis on the hot path: drawing through hypothesis cost 98% of the time).
Worker ``k`` seeds its generator with ``seed + k``, so a run is reproducible
from its arguments.  The first failing schedule is shrunk (whole steps
deleted, then bytes lowered, while it still fails) and comes back as a
runnable snippet; the other workers are stopped.
"""
from __future__ import annotations

import multiprocessing as mp
import queue as queue_module
import random
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Optional

from .properties import executor_violation
from .schedule import Op, Schedule
from .strategies import BYTES_PER_STEP, build_schedule, random_schedule

_PROGRESS_EVERY = 250


@dataclass(frozen=True)
class FuzzConfig:
    schedules: int = 10_000
    seed: int = 0
    jobs: int = 1
    max_steps: int = 40
    max_streams: int = 4
    max_events: int = 3
    max_devices: int = 2
    misuse: bool = True
    execute: bool = False  # also check verdicts on the simulated device
    model: str = "python"  # the lifetime model checked: python (the reference) or native (C++)

    def __post_init__(self) -> None:
        """Refuses what would run nothing or fail inside a worker (a negative
        count ran 0 schedules, ``jobs=0`` ran anyway, a str failed deep in
        the generator)."""
        for name, least in (("schedules", 1), ("jobs", 1), ("max_steps", 1), ("max_streams", 1),
                            ("max_events", 0), ("max_devices", 1), ("seed", None)):
            value = getattr(self, name)
            what = "an int" if least is None else f"an int >= {least}"
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"FuzzConfig: {name} must be {what}, not {type(value).__name__} {value!r}")
            if least is not None and value < least:
                raise ValueError(f"FuzzConfig: {name} must be at least {least}, not {value}")
        for name in ("misuse", "execute"):
            if not isinstance(getattr(self, name), bool):
                value = getattr(self, name)
                raise TypeError(f"FuzzConfig: {name} must be True or False, not {type(value).__name__} {value!r}")
        from ..lifetime import MODELS

        if self.model not in MODELS:
            raise ValueError(f"FuzzConfig: model must be one of {', '.join(MODELS)}, not {self.model!r}")


@dataclass(frozen=True)
class Failure:
    schedule: Schedule
    problem: str
    worker: int
    check: str  # the expression that shows it, for the reproducer


@dataclass
class Tally:
    """What the checked schedules contained."""

    schedules: int = 0
    steps: int = 0
    lengths: list = field(default_factory=list)
    kinds: Counter = field(default_factory=Counter)
    findings: Counter = field(default_factory=Counter)

    def add(self, schedule: Schedule, found: list) -> None:
        self.schedules += 1
        self.steps += len(schedule.steps)
        self.lengths.append(len(schedule.steps))
        for step in schedule.steps:
            self.kinds[_kind_name(step)] += 1
            if isinstance(step, Op):
                for inner in (*step.before, *step.after):
                    self.kinds["in-op " + _kind_name(inner)] += 1
        for key in found:
            self.findings[key[0]] += 1

    def merge(self, other: "Tally") -> None:
        self.schedules += other.schedules
        self.steps += other.steps
        self.lengths += other.lengths
        self.kinds.update(other.kinds)
        self.findings.update(other.findings)

    def describe(self) -> list:
        """Lines: the distribution of lengths, step kinds and findings."""
        if not self.lengths:
            return []
        lengths = sorted(self.lengths)
        top = max(lengths[-1], 1)
        buckets = Counter(min(n * 4 // (top + 1), 3) for n in lengths)
        width = (top + 1) / 4
        spans = ", ".join(
            f"{int(b * width)}-{int((b + 1) * width) - 1 if b < 3 else top}: {buckets[b] / len(lengths):.0%}"
            for b in range(4)
        )
        total = sum(v for k, v in self.kinds.items() if not k.startswith("in-op "))
        kinds = ", ".join(
            f"{k} {v / total:.1%}" for k, v in self.kinds.most_common() if not k.startswith("in-op ")
        )
        inner = ", ".join(f"{k[6:]} {v}" for k, v in self.kinds.most_common() if k.startswith("in-op "))
        findings = ", ".join(f"{k} {v}" for k, v in self.findings.most_common()) or "none"
        return [
            f"steps per schedule: min {lengths[0]}, median {statistics.median(lengths):g}, "
            f"mean {statistics.fmean(lengths):.1f}, max {lengths[-1]} ({spans})",
            f"step kinds: {kinds}",
            f"events inside ops: {inner or 'none'}",
            f"findings in the checked schedules: {findings}",
        ]


@dataclass(frozen=True)
class FuzzResult:
    checked: int
    seconds: float
    failure: Optional[Failure]
    tally: Tally = field(default_factory=Tally)

    @property
    def per_minute(self) -> float:
        return self.checked / self.seconds * 60 if self.seconds else 0.0

    @property
    def steps_per_minute(self) -> float:
        return self.tally.steps / self.seconds * 60 if self.seconds else 0.0


_KIND_NAMES: dict = {}


def _kind_name(step) -> str:
    """``SyncDevice`` -> ``sync_device`` (once per step class)."""
    cls = type(step)
    name = _KIND_NAMES.get(cls)
    if name is None:
        name = _KIND_NAMES[cls] = "".join("_" + c.lower() if c.isupper() else c for c in cls.__name__).lstrip("_")
    return name


def check(schedule: Schedule, config: FuzzConfig, seed: int) -> tuple:
    """``(problem or None, check expression, the model's findings)``."""
    from .compare import compare

    comparison = compare(schedule, config.model)
    if not comparison.agree:
        expression = "compare(schedule)" if config.model == "python" else f"compare(schedule, {config.model!r})"
        return str(comparison), expression, comparison.model
    if config.execute:
        problem = executor_violation(schedule, seed)
        if problem is not None:
            return problem, f"executor_violation(schedule, {seed})", comparison.model
    return None, "", comparison.model


def shrink(data: bytes, schedule_config: tuple, fails: Callable[[Schedule], bool]) -> bytes:
    """A smaller byte string whose schedule still ``fails``: deletes runs of
    steps (halving the run length), then lowers each byte, until neither
    helps."""
    steps = [data[i:i + BYTES_PER_STEP] for i in range(0, len(data) - len(data) % BYTES_PER_STEP, BYTES_PER_STEP)]

    def still(candidate: list) -> bool:
        return fails(build_schedule(b"".join(candidate), *schedule_config))

    progress = True
    while progress:
        progress = False
        run = max(1, len(steps) // 2)
        while run >= 1:
            i = 0
            while i < len(steps):
                candidate = steps[:i] + steps[i + run:]
                if still(candidate):
                    steps, progress = candidate, True
                else:
                    i += run
            run //= 2
        for i in range(len(steps)):
            for j in range(BYTES_PER_STEP):
                for value in (0, steps[i][j] // 2, steps[i][j] - 1):
                    if 0 <= value < steps[i][j]:
                        lowered = bytearray(steps[i])
                        lowered[j] = value
                        candidate = steps[:i] + [bytes(lowered)] + steps[i + 1:]
                        if still(candidate):
                            steps, progress = candidate, True
    return b"".join(steps)


def _shrink_config(data: bytes, schedule_config: tuple, fails) -> tuple:
    """Fewer streams, events and devices while it still fails."""
    streams, events, devices, blocks, misuse = schedule_config
    for name in ("devices", "events", "streams"):
        while True:
            trial = dict(streams=streams, events=events, devices=devices)
            trial[name] -= 1
            if trial["streams"] < 1 or trial["devices"] < 1 or trial["events"] < 0:
                break
            if trial["devices"] > trial["streams"]:
                break
            candidate = (trial["streams"], trial["events"], trial["devices"], blocks, misuse)
            if not fails(build_schedule(data, *candidate)):
                break
            streams, events, devices = trial["streams"], trial["events"], trial["devices"]
    return (streams, events, devices, blocks, misuse)


def _run_worker(config: FuzzConfig, worker: int, count: int, report: Callable) -> None:
    """Runs ``count`` schedules; calls ``report(kind, payload)`` with
    ``("progress", n)``, then ``("done", Tally)`` or ``("failed", (Failure, Tally))``."""
    rng = random.Random(config.seed + worker)
    tally = Tally()
    since = 0
    for n in range(count):
        schedule, schedule_config, data = random_schedule(
            rng, config.max_streams, config.max_events, config.max_steps,
            misuse=config.misuse, max_devices=config.max_devices,
        )
        problem, expression, found = check(schedule, config, n)
        tally.add(schedule, found)
        since += 1
        if since == _PROGRESS_EVERY:
            report("progress", since)
            since = 0
        if problem is not None:
            report("progress", since)
            report("failed", (_minimal_failure(config, n, schedule_config, data, worker), tally))
            return
    report("progress", since)
    report("done", tally)


def _minimal_failure(config: FuzzConfig, n: int, schedule_config: tuple, data: bytes, worker: int) -> Failure:
    def fails(schedule: Schedule) -> bool:
        return check(schedule, config, n)[0] is not None

    data = shrink(data, schedule_config, fails)
    schedule_config = _shrink_config(data, schedule_config, fails)
    data = shrink(data, schedule_config, fails)
    schedule = build_schedule(data, *schedule_config)
    problem, expression, _ = check(schedule, config, n)
    return Failure(schedule, problem, worker, expression)


def _shares(total: int, jobs: int) -> list:
    return [total // jobs + (1 if i < total % jobs else 0) for i in range(jobs)]


def _worker_main(config, worker, count, q) -> None:
    _run_worker(config, worker, count, lambda kind, payload: q.put((kind, payload)))


def fuzz(config: FuzzConfig, progress: Optional[Callable[[int], None]] = None) -> FuzzResult:
    """Runs the fuzzer; ``progress(checked)`` is called as schedules pass."""
    start = time.perf_counter()
    counted = {"n": 0}

    def on_progress(n: int) -> None:
        counted["n"] += n
        if progress:
            progress(counted["n"])

    shares = [c for c in _shares(config.schedules, max(1, config.jobs)) if c]
    if len(shares) <= 1:
        outcome: dict = {"failure": None, "tally": Tally()}

        def report(kind, payload):
            if kind == "progress":
                on_progress(payload)
            elif kind == "failed":
                outcome["failure"], outcome["tally"] = payload
            else:
                outcome["tally"] = payload

        _run_worker(config, 0, shares[0] if shares else 0, report)
        return FuzzResult(counted["n"], time.perf_counter() - start, outcome["failure"], outcome["tally"])
    return _fuzz_parallel(config, shares, on_progress, start, counted)


def _fuzz_parallel(config, shares, on_progress, start, counted) -> FuzzResult:
    ctx = mp.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_worker_main, args=(config, w, n, q), daemon=True) for w, n in enumerate(shares)]
    for p in procs:
        p.start()
    running, failure, tally = len(procs), None, Tally()
    try:
        while running and failure is None:
            try:
                kind, payload = q.get(timeout=1.0)
            except queue_module.Empty:
                if not any(p.is_alive() for p in procs):
                    raise RuntimeError("fuzz workers exited without reporting") from None
                continue
            if kind == "progress":
                on_progress(payload)
            elif kind == "done":
                running -= 1
                tally.merge(payload)
            else:
                failure, worker_tally = payload
                tally.merge(worker_tally)
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
            p.join()
    return FuzzResult(counted["n"], time.perf_counter() - start, failure, tally)
