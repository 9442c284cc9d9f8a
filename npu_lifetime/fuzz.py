"""``npu-lifetime fuzz``: random schedules through the model and its checks.

Each worker process runs hypothesis with its own seed (``seed + worker``), so
a run is reproducible from its arguments.  On the first failing schedule,
hypothesis shrinks it to a minimal one; the other workers are stopped and
the minimal schedule comes back as a runnable snippet.
"""
from __future__ import annotations

import multiprocessing as mp
import queue as queue_module
import sys
import time
from dataclasses import dataclass
from typing import Callable, Optional

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed

from .schedules.properties import executor_violation, oracle_disagreement
from .schedules.schedule import Schedule
from .schedules.strategies import schedules

_PROGRESS_EVERY = 250


@dataclass(frozen=True)
class FuzzConfig:
    schedules: int = 10_000
    seed: int = 0
    jobs: int = 1
    max_steps: int = 40
    max_streams: int = 4
    max_events: int = 3
    misuse: bool = True
    execute: bool = False  # also check verdicts on the simulated device


@dataclass(frozen=True)
class Failure:
    schedule: Schedule
    problem: str
    worker: int


@dataclass(frozen=True)
class FuzzResult:
    checked: int
    seconds: float
    failure: Optional[Failure]

    @property
    def per_minute(self) -> float:
        return self.checked / self.seconds * 60 if self.seconds else 0.0


def check(schedule: Schedule, config: FuzzConfig, seed: int) -> Optional[str]:
    problem = oracle_disagreement(schedule)
    if problem is None and config.execute:
        problem = executor_violation(schedule, seed)
    return problem


def _run_worker(config: FuzzConfig, worker: int, count: int, report: Callable) -> None:
    """Runs ``count`` schedules; calls ``report(kind, payload)`` with
    ``("progress", n)``, then ``("done", n)`` or ``("failed", Failure)``."""
    strategy = schedules(config.max_streams, config.max_events, config.max_steps, misuse=config.misuse)
    state = {"n": 0, "last": None}

    @hypothesis_seed(config.seed + worker)
    @settings(
        max_examples=count,
        deadline=None,
        database=None,
        derandomize=False,
        phases=[Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
    )
    @given(strategy)
    def property_holds(schedule: Schedule) -> None:
        state["n"] += 1
        if state["n"] % _PROGRESS_EVERY == 0:
            report("progress", _PROGRESS_EVERY)
        problem = check(schedule, config, state["n"])
        if problem is not None:
            state["last"] = Failure(schedule, problem, worker)  # the final one is minimal
            raise AssertionError(problem)

    try:
        property_holds()
    except AssertionError:
        report("progress", state["n"] % _PROGRESS_EVERY)
        report("failed", state["last"])
        return
    report("progress", state["n"] % _PROGRESS_EVERY)
    report("done", state["n"])


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
        failure: list = []

        def report(kind, payload):
            if kind == "progress":
                on_progress(payload)
            elif kind == "failed":
                failure.append(payload)

        _run_worker(config, 0, shares[0] if shares else 0, report)
        return FuzzResult(counted["n"], time.perf_counter() - start, failure[0] if failure else None)
    return _fuzz_parallel(config, shares, on_progress, start, counted)


def _fuzz_parallel(config, shares, on_progress, start, counted) -> FuzzResult:
    ctx = mp.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_worker_main, args=(config, w, n, q), daemon=True) for w, n in enumerate(shares)]
    for p in procs:
        p.start()
    running, failure = len(procs), None
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
            else:
                failure = payload
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
            p.join()
    return FuzzResult(counted["n"], time.perf_counter() - start, failure)
