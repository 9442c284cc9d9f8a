#!/usr/bin/env python3
"""Runs torch's own allocator tests under torch's allocator and under the
shim, and compares the outcomes (issue 16).

    python3 tests/upstream/run_suites.py .gl/upstream --out .gl/upstream-runs

runs every suite of SUITES (the upstream files, fetched as
tests/upstream/SOURCES.txt says, under UPSTREAM/test/...) once with
NPU_LIFETIME_UPSTREAM_ALLOCATOR=native and once with =shim, the two
allocators side by side as two pytest processes (--serial: one after the
other), each suite under its own timeout.  Each allocator's run of a suite
is a loop of pytest processes with -x, as torch CI's run_test.py
"stepcurrent" does: when a test fails, the next process goes on from the
test after it, so that a failure which leaves the process in a bad state (a
CUDA graph capture left open) cannot fail the tests after it; a test that
outlives --test-timeout is killed and recorded as timeout, and the loop goes
on past it (--no-isolate: one process for the whole suite).  Then the tests whose outcome
differs are run once more, alone and one allocator after the other, so that
a difference caused by the two runs sharing the GPU is told apart
(--no-confirm skips that).

Prints a line per restart and per finished suite and allocator, then the counts per
allocator and every difference with the head of its failure message; the
same goes to OUT/comparison.json and OUT/comparison.md.  Exit status 0 when
the pass sets are the same, 1 when they differ, 2 on a usage error.

Torch-free on purpose (the comparison is unit-tested on CPU in
tests/tooling/test_upstream_runner.py): torch is only imported by the pytest
processes it starts.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
SITE = HERE / "site"  # sitecustomize.py: the shim in every test subprocess
STUBS = HERE / "stubs"  # psutil stand-in, only where the real one is missing
ALLOCATORS = ("native", "shim")

# The allocator-relevant parts of torch's tests: a pytest -k expression per
# file (None: the whole file).  pytest matches -k words case-insensitively
# against the test's name and its class's name.
#
# test_cuda.py: the device caching allocator's contract as torch states it
# to users: allocation/free/caching and empty_cache, memory statistics,
# snapshots and history, the memory fraction and OOM behaviour, MemPool and
# graph-private pools, CUDA graphs (capture allocates from private pools),
# record_stream and the stream/event ordering the allocator relies on, and
# cudnn (benchmark mode allocates workspaces through the allocator), the
# cuBLAS workspaces (allocated through it and checked with its statistics),
# non-blocking copies, autocast's cache-leak check (memory_allocated).  Whole
# classes: TestCudaAllocator (snapshots, history, allocator settings, OOM,
# raw_alloc, fuzz), TestMemPool, TestBlockStateAbsorption (graph pools'
# block states and checkpoints), and, through their names,
# TestCachingHostAllocatorCudaGraph and TestFXMemoryProfiler.  Left out:
# autocast, optimizers (TestCudaOptims keeps only its graph tests),
# compiled kernels, GDS, green contexts, arch lists, blas settings: they
# never touch the allocator beyond allocating.  TestCudaMallocAsync (older
# torch versions; the copy in SOURCES.txt has none) compares torch's two
# built-in backends (native vs cudaMallocAsync: backend switching,
# PYTORCH_CUDA_ALLOC_CONF parsing, per-backend expectations) and is left out
# should a newer or older copy have it.
# test_cudagraph_trees.py: whole, since inductor's CUDA-graph trees are
# built on the allocator's private pools, checkpointing and block states.
TEST_CUDA_KEYWORDS = (
    "caching_allocator", "cachingAllocator", "allocator", "memory", "mem_get_info", "record_stream", "graph",
    "mempool", "mem_pool", "pool", "snapshot", "empty_cache", "memory_fraction", "oom", "cudnn", "stream",
    "event", "workspace", "non_blocking", "cache_leak",
    "TestCudaAllocator", "TestMemPool", "TestBlockStateAbsorption",
)
# Tests of the copies in SOURCES.txt that torch 2.11 cannot run under either
# allocator: added after 2.11, they use what it lacks
# (torch._inductor.utils.get_static_bw_input_idxs, forward_is_partitioned).
AFTER_2_11 = ("test_graph_partition_saved_activation_not_static", "test_graph_partition_no_partition_keeps_static")
SUITES = {
    "test_cuda": ("test/test_cuda.py",
                  "(" + " or ".join(TEST_CUDA_KEYWORDS) + ") and not TestCudaMallocAsync"),
    "test_cudagraph_trees": ("test/inductor/test_cudagraph_trees.py",
                             " and ".join(f"not {name}" for name in AFTER_2_11)),
}

OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "timeout")


# ---------------------------------------------------------------- results


@dataclass
class Result:
    outcome: str  # one of OUTCOMES
    message: str = ""


def test_id(classname: str, name: str) -> str:
    return f"{classname}::{name}" if classname else name


def nodeid_to_id(nodeid: str) -> str:
    """pytest's node id as junit's classname::name
    (test/test_cuda.py::TestCuda::test_x -> test.test_cuda.TestCuda::test_x)."""
    parts = nodeid.split("::")
    module = parts[0][:-3] if parts[0].endswith(".py") else parts[0]
    classname = ".".join([module.replace("/", ".")] + parts[1:-1])
    return test_id(classname, parts[-1]) if len(parts) > 1 else module.replace("/", ".")


def _message_head(element, lines: int = 12, chars: int = 2000) -> str:
    message = element.get("message") or ""
    text = (element.text or "").strip()
    kept = [line for line in text.splitlines() if line.strip()][-lines:]
    head = message.strip()
    if kept:
        head = (head + "\n" if head else "") + "\n".join(kept)
    return head[-chars:] if len(head) > chars else head


def parse_junit(path) -> dict:
    """{test id: Result} from a pytest --junitxml file.  A test case with an
    <error> (setup or teardown, or collection) is an error even when it also
    failed; pytest's xfail (a <skipped> of type pytest.xfail) is xfailed."""
    root = ET.parse(path).getroot()
    results: dict = {}
    for case in root.iter("testcase"):
        key = test_id(case.get("classname", ""), case.get("name", ""))
        error, failure, skipped = case.find("error"), case.find("failure"), case.find("skipped")
        if error is not None:
            result = Result("error", _message_head(error))
        elif failure is not None:
            result = Result("failed", _message_head(failure))
        elif skipped is not None:
            kind = "xfailed" if (skipped.get("type") or "") == "pytest.xfail" else "skipped"
            result = Result(kind, _message_head(skipped))
        else:
            result = Result("passed")
        earlier = results.get(key)
        if earlier is None or OUTCOMES.index(result.outcome) in (1, 2):  # a second entry only worsens
            results[key] = result
    return results


def parse_jsonl(path) -> dict:
    """{test id: Result} from the plugin's results.jsonl: for a run killed by
    its timeout (no junit file), and for the processes of an isolated run; a
    test that started and never ended is a timeout, one that run_suites.py
    marked ``killed`` has the outcome and message of that line."""
    results: dict = {}
    open_tests: set = set()
    with open(path) as fh:
        for line in fh:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # the line the kill cut
            nodeid = record.get("nodeid", "")
            key = nodeid_to_id(nodeid)
            event = record.get("event")
            if event == "start":
                open_tests.add(nodeid)
            elif event == "end":
                open_tests.discard(nodeid)
            elif event == "killed":
                open_tests.discard(nodeid)
                results[key] = Result(record.get("outcome", "timeout"), record.get("message", ""))
            elif event == "report":
                outcome = record.get("outcome")
                if record.get("xfail") and outcome == "skipped":
                    outcome = "xfailed"
                elif outcome == "failed" and record.get("when") != "call":
                    outcome = "error"
                earlier = results.get(key)
                if earlier is None or earlier.outcome in ("passed", "skipped"):
                    results[key] = Result(outcome, record.get("message", ""))
    for nodeid in open_tests:
        results[nodeid_to_id(nodeid)] = Result("timeout", "still running when the suite's timeout killed the run")
    return results


def counts(results: dict) -> dict:
    tally = {outcome: 0 for outcome in OUTCOMES}
    for result in results.values():
        tally[result.outcome] = tally.get(result.outcome, 0) + 1
    tally["total"] = len(results)
    return tally


def differences(by_allocator: dict) -> list:
    """Every test whose outcome is not the same under every allocator (a
    test missing from a run is "absent"), as dicts sorted by test id."""
    names = list(by_allocator)
    keys = sorted(set().union(*(set(r) for r in by_allocator.values())))
    diffs = []
    for key in keys:
        row = {name: by_allocator[name].get(key) for name in names}
        outcomes = {name: (r.outcome if r else "absent") for name, r in row.items()}
        if len(set(outcomes.values())) > 1:
            diffs.append({"test": key, "outcomes": outcomes,
                          "messages": {name: r.message for name, r in row.items() if r and r.message}})
    return diffs


def compare(by_allocator: dict) -> dict:
    """Counts per allocator, the differences, and whether the pass sets match."""
    passed = {name: {k for k, r in results.items() if r.outcome == "passed"} for name, results in
              by_allocator.items()}
    sets = list(passed.values())
    return {
        "counts": {name: counts(results) for name, results in by_allocator.items()},
        "differences": differences(by_allocator),
        "same_pass_set": all(s == sets[0] for s in sets),
    }


def render_markdown(comparison: dict, title: str = "torch's allocator tests: native vs shim") -> str:
    lines = [f"# {title}", ""]
    meta = comparison.get("meta")
    if meta:
        for key, value in meta.items():
            lines.append(f"- {key}: {value}")
        lines.append("")
    for suite, block in comparison.get("suites", {"all": comparison}).items():
        lines += [f"## {suite}", "", "| allocator | " + " | ".join(OUTCOMES) + " | total |",
                  "|---|" + "---|" * (len(OUTCOMES) + 1)]
        for name, tally in block["counts"].items():
            lines.append(f"| {name} | " + " | ".join(str(tally.get(o, 0)) for o in OUTCOMES)
                         + f" | {tally['total']} |")
        lines.append("")
        for name, run in block.get("runs", {}).items():
            state = "TIMED OUT" if run.get("timed_out") else f"exit {run.get('returncode')}"
            lines.append(f"- {name}: {state}, {run.get('elapsed_s')}s, backend {run.get('allocator_backend')}"
                         + (f", {run['processes']} pytest processes ({len(run.get('restarts') or [])} restarts)"
                            if (run.get("processes") or 1) > 1 else "")
                         + (f", shim findings {run.get('shim_findings')}" if name == "shim" and run.get("shim_findings") is not None else "")
                         + (f", ERROR {run['error']}" if run.get("error") else ""))
        lines.append("")
        lines.append(f"same pass set: {'yes' if block['same_pass_set'] else 'NO'}; "
                     f"differences: {len(block['differences'])}")
        lines.append("")
        for diff in block["differences"]:
            outcomes = ", ".join(f"{k}={v}" for k, v in diff["outcomes"].items())
            confirmed = diff.get("confirmed")
            note = "" if confirmed is None else (" (confirmed alone)" if confirmed else
                                                 f" (NOT confirmed alone: {diff.get('rerun')})")
            lines.append(f"- `{diff['test']}`: {outcomes}{note}")
            for name, message in diff["messages"].items():
                lines.append(f"  - {name}:")
                lines.append("    ```")
                lines += ["    " + line for line in message.splitlines()]
                lines.append("    ```")
        lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------- running


@dataclass
class Run:
    suite: str
    allocator: str
    out: Path
    returncode: int | None = None
    elapsed: float = 0.0
    timed_out: bool = False
    results: dict = field(default_factory=dict)
    report: dict = field(default_factory=dict)
    processes: int = 1  # pytest processes of an isolated run
    restarts: list = field(default_factory=list)  # "<node id> <why>" per restart


def pytest_command(python: str, upstream: Path, path: str, junit: Path, extra: list) -> list:
    command = [python, "-m", "pytest", str(upstream / path), "-p", "shim_plugin", "-c", os.devnull,
               f"--rootdir={upstream / 'test'}", f"--junitxml={junit}", "-o", "junit_family=xunit1", "-q", "-rN", "--tb=short",
               "-p", "no:cacheprovider"]
    return command + list(extra)


_HAS_PSUTIL: dict = {}


def needs_psutil_stub(python: str) -> bool:
    """Whether ``python`` lacks psutil (test_cuda.py imports it at module level)."""
    if python not in _HAS_PSUTIL:
        probe = subprocess.run([python, "-c", "import psutil"], capture_output=True)
        _HAS_PSUTIL[python] = probe.returncode == 0
    return not _HAS_PSUTIL[python]


def environment(allocator: str, upstream: Path, out: Path, slow: bool, site: bool = True,
                python: str = sys.executable, keywords: str | None = None) -> dict:
    env = dict(os.environ)
    env.pop("NPU_LIFETIME_UPSTREAM_SELECT", None)
    if keywords:
        env["NPU_LIFETIME_UPSTREAM_SELECT"] = keywords  # shim_plugin applies it to class/test names
    paths = [str(HERE), str(REPO), str(upstream / "test")]
    if allocator == "shim" and site:
        paths.insert(0, str(SITE))
    if needs_psutil_stub(python):
        paths.append(str(STUBS))
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["NPU_LIFETIME_UPSTREAM_ALLOCATOR"] = allocator
    env["NPU_LIFETIME_UPSTREAM_OUT"] = str(out)
    # torch's tests build C++ extensions (test_cuda.py's dummy allocators) into one cache folder by
    # name: two allocators side by side would load each other's half-built or differently built
    # copies (seen: "undefined symbol: called_dummy_alloc" under torch's allocator only)
    env["TORCH_EXTENSIONS_DIR"] = str(out / "torch_extensions")
    env.setdefault("PYTHONUNBUFFERED", "1")
    if slow:
        env["PYTORCH_TEST_WITH_SLOW"] = "1"
    return env


def run_one(run: Run, command: list, env: dict, timeout: float, log, resume: bool = False) -> Run:
    run.out.mkdir(parents=True, exist_ok=True)
    for stale in (("junit.xml",) if resume else ("results.jsonl", "report.json", "junit.xml")):
        (run.out / stale).unlink(missing_ok=True)
    if resume:
        env = dict(env, NPU_LIFETIME_UPSTREAM_RESUME="1")
    (run.out / "command.txt").write_text(" ".join(command) + "\n")
    start = time.time()
    with open(run.out / "pytest.log", "w") as logfile:
        proc = subprocess.Popen(command, cwd=str(REPO), env=env, stdout=logfile, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            run.returncode = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            run.timed_out = True
            _stop(proc)
            run.returncode = proc.returncode
    run.elapsed = time.time() - start
    junit, jsonl, report = run.out / "junit.xml", run.out / "results.jsonl", run.out / "report.json"
    if junit.exists() and not run.timed_out and not resume:
        run.results = parse_junit(junit)
    elif jsonl.exists():
        run.results = parse_jsonl(jsonl)
    if report.exists():
        run.report = json.loads(report.read_text())
    log_finished(run, log)
    return run


def log_finished(run: Run, log) -> None:
    tally = counts(run.results)
    state = "TIMED OUT" if run.timed_out else f"exit {run.returncode}"
    log(f"[{time.strftime('%H:%M:%S')}] {run.suite} / {run.allocator}: {state} after {run.elapsed:.0f}s: "
        + ", ".join(f"{tally[o]} {o}" for o in OUTCOMES if tally[o]) + f" ({tally['total']} tests)"
        + (f" in {run.processes} pytest processes" if run.processes > 1 else "")
        + (f"; shim findings: {run.report.get('finding_count')}" if run.allocator == "shim" and run.report else "")
        + ("" if run.results else f"; no results, see {run.out / 'pytest.log'}"))


def _stop(proc) -> None:
    """SIGTERM to the pytest process's group, SIGKILL after 30 s."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


class JsonlTail:
    """What one pytest process appends to results.jsonl, read as it grows:
    the node ids it collected, the tests it is in (with their start times),
    those that ended, and the last that failed."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0
        self._cut = b""
        self.collected = None  # node ids, from the plugin's "collected" line
        self.open: dict = {}  # node id -> start time
        self.ended: list = []
        self.last_bad = None  # (node id, "failed" | "failed in setup" | ...)

    def read(self) -> None:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except FileNotFoundError:
            return
        self.offset += len(data)
        lines = (self._cut + data).split(b"\n")
        self._cut = lines.pop()
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            event, nodeid = record.get("event"), record.get("nodeid")
            if event == "collected":
                self.collected = list(record.get("nodeids", []))
            elif event == "start":
                self.open[nodeid] = record.get("t") or time.time()
            elif event == "end":
                self.open.pop(nodeid, None)
                self.ended.append(nodeid)
            elif event == "report" and record.get("outcome") == "failed":
                when = record.get("when")
                self.last_bad = (nodeid, "failed" if when == "call" else f"failed in {when}")


def _kill_record(path: Path, nodeid: str, outcome: str, message: str) -> None:
    with open(path, "a") as fh:
        fh.write(json.dumps({"event": "killed", "nodeid": nodeid, "outcome": outcome, "message": message}) + "\n")


POLL_S = 0.25


def run_isolated(run: Run, command: list, env: dict, timeout: float, test_timeout: float, log,
                 resume: bool = False) -> Run:
    """A loop of pytest processes with -x, each going on after the tests the
    ones before it finished (the plugin's resume), until every collected test
    has a result or ``timeout`` (for the whole loop) is spent.  The failing
    test keeps its result; the tests after it run in a fresh process.  A test
    that runs longer than ``test_timeout`` seconds (0: no limit) is killed with
    its process and recorded as timeout; one whose process dies under it, as
    error; neither is run again."""
    run.out.mkdir(parents=True, exist_ok=True)
    for stale in (("junit.xml",) if resume else ("results.jsonl", "report.json", "junit.xml")):
        (run.out / stale).unlink(missing_ok=True)
    env = dict(env, NPU_LIFETIME_UPSTREAM_RESUME="1")  # an empty results.jsonl resumes nothing
    command = list(command) + ["-x"]
    (run.out / "command.txt").write_text(" ".join(command) + "\n")
    jsonl = run.out / "results.jsonl"
    start = time.time()
    deadline = start + timeout
    name = f"{run.suite} / {run.allocator}"
    run.processes = 0
    with open(run.out / "pytest.log", "a" if resume else "w") as logfile:
        while True:
            run.processes += 1
            logfile.write(f"\n==== run_suites: pytest process {run.processes} of {name} ====\n")
            logfile.flush()
            tail = JsonlTail(jsonl)
            proc = subprocess.Popen(command, cwd=str(REPO), env=env, stdout=logfile, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            killed = None  # "deadline" | node id of a test past test_timeout
            while True:
                try:
                    run.returncode = proc.wait(timeout=POLL_S)
                    break
                except subprocess.TimeoutExpired:
                    pass
                tail.read()
                now = time.time()
                if now >= deadline:
                    killed = "deadline"
                elif test_timeout > 0:
                    late = [n for n, t in tail.open.items() if now - t > test_timeout]
                    killed = late[0] if late else None
                if killed:
                    _stop(proc)
                    run.returncode = proc.returncode
                    logfile.write(f"\n==== run_suites: killed process {run.processes} "
                                  + ("at the suite's --timeout" if killed == "deadline" else
                                     f"after {killed} ran past --test-timeout") + " ====\n")
                    logfile.flush()
                    break
            tail.read()
            if killed == "deadline":
                run.timed_out = True  # the test it was in: "timeout" (parse_jsonl), rerun by a later --resume
                break
            cause = None
            for nodeid in list(tail.open):  # killed for its timeout, or the process died under it
                if nodeid == killed:
                    outcome, why = "timeout", f"timed out (> {test_timeout:.0f}s)"
                    message = (f"ran longer than --test-timeout {test_timeout:.0f}s: killed with its pytest "
                               "process; the tests after it ran in a fresh one")
                else:
                    outcome, why = "error", f"crashed its process (exit {run.returncode})"
                    message = f"the pytest process ended (exit {run.returncode}) while this test ran"
                _kill_record(jsonl, nodeid, outcome, message)
                tail.open.pop(nodeid)
                tail.ended.append(nodeid)
                cause = (nodeid, why)
            cause = cause or tail.last_bad
            done = set(tail.ended)
            left = [n for n in (tail.collected or []) if n not in done]
            if not left:
                break
            if not tail.ended or run.returncode == 0 or cause is None:
                log(f"[{time.strftime('%H:%M:%S')}] {name}: process {run.processes} stopped "
                    f"(exit {run.returncode}) with {len(left)} tests left and no failing test to go on "
                    f"after; not restarted, see {run.out / 'pytest.log'}")
                break
            if time.time() >= deadline:
                run.timed_out = True
                break
            run.restarts.append(f"{cause[0]} {cause[1]}")
            log(f"[{time.strftime('%H:%M:%S')}] {name}: restart {len(run.restarts)} after "
                f"{cause[0]} {cause[1]}, {len(left)} tests left")
    run.elapsed = time.time() - start
    if jsonl.exists():
        run.results = parse_jsonl(jsonl)
    if (run.out / "report.json").exists():
        run.report = json.loads((run.out / "report.json").read_text())
    log_finished(run, log)
    return run


def run_suite_allocators(suite: str, upstream: Path, allocators, keywords, out: Path, args, log,
                         serial: bool, extra=()) -> dict:
    path = args.table[suite][0]
    runs = {}
    threads = []
    for allocator in allocators:
        run_out = out / suite / allocator
        run = Run(suite, allocator, run_out)
        command = pytest_command(args.python, upstream, path, run_out / "junit.xml",
                                 list(args.pytest_args) + list(extra))
        env = environment(allocator, upstream, run_out, args.slow, args.site, args.python, keywords)
        runs[allocator] = run
        if args.isolate:  # each allocator loops on its own
            target = (run_isolated, (run, command, env, args.timeout, args.test_timeout, log, args.resume))
        else:
            target = (run_one, (run, command, env, args.timeout, log, args.resume))
        if serial:
            target[0](*target[1])
        else:
            thread = threading.Thread(target=target[0], args=target[1])
            thread.start()
            threads.append(thread)
    for thread in threads:
        thread.join()
    return runs


def _node_for(test: str, upstream: Path, path: str) -> str:
    """A difference's test id back as a node id of the suite's file."""
    classname, _, name = test.rpartition("::")
    module = path[:-3].replace("/", ".")
    classes = classname[len(module) + 1:].split(".") if classname.startswith(module + ".") else []
    return "::".join([str(upstream / path)] + [c for c in classes if c] + [name])


def confirm(suite: str, block: dict, upstream: Path, out: Path, args, log) -> None:
    """Runs each differing test alone, one allocator after the other, and
    marks whether the difference holds there."""
    path = args.table[suite][0]
    for index, diff in enumerate(block["differences"]):
        if "absent" in diff["outcomes"].values():
            continue
        node = _node_for(diff["test"], upstream, path)
        runs = {}
        for allocator in diff["outcomes"]:
            run_out = out / "confirm" / suite / f"{index:03d}" / allocator
            run = Run(suite, allocator, run_out)
            command = pytest_command(args.python, upstream, path, run_out / "junit.xml",
                                     list(args.pytest_args))
            command[3] = node
            run_one(run, command, environment(allocator, upstream, run_out, args.slow, args.site, args.python),
                    args.timeout, lambda line: None)
            runs[allocator] = run
        rerun = {a: (r.results.get(diff["test"]).outcome if r.results.get(diff["test"]) else "absent")
                 for a, r in runs.items()}
        diff["rerun"] = rerun
        diff["confirmed"] = len(set(rerun.values())) > 1
        log(f"  confirm {diff['test']}: {rerun} -> {'holds' if diff['confirmed'] else 'gone when alone'}")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description="Run torch's allocator tests (test_cuda.py's allocator parts, test_cudagraph_trees.py) "
                    "under torch's allocator and under the npu_lifetime shim, and compare the outcomes.")
    parser.add_argument("upstream", type=Path,
                        help="folder holding the upstream files as test/test_cuda.py, "
                             "test/inductor/test_cudagraph_trees.py (e.g. .gl/upstream)")
    parser.add_argument("--allocator", "-a", choices=("both",) + ALLOCATORS, default="both",
                        help="which allocator(s) to run (default: both)")
    parser.add_argument("--suite", "-s", action="append", choices=sorted(SUITES),
                        help="a suite to run (repeatable; default: all)")
    parser.add_argument("-k", dest="keywords", action="append", default=[],
                        help="a pytest -k style expression over class and test names, ANDed with the suite's "
                             "selection (repeatable; applied by shim_plugin, not pytest's -k, which would also "
                             "match the folder names above the file)")
    parser.add_argument("--whole", action="store_true",
                        help="drop the allocator-relevant selection (SUITES' -k): every test of the files")
    parser.add_argument("--timeout", type=float, default=3600.0,
                        help="seconds one suite under one allocator may run, all its pytest processes together, "
                             "before it is killed (default 3600)")
    parser.add_argument("--isolate-failures", dest="isolate", action="store_true", default=True,
                        help="(default) run each suite as a loop of pytest processes with -x: after a failing "
                             "test the next process goes on from the test after it, so that a failure that "
                             "leaves the process in a bad state (a CUDA graph capture left open) cannot fail "
                             "the tests after it (torch CI's run_test.py stepcurrent)")
    parser.add_argument("--no-isolate", dest="isolate", action="store_false",
                        help="one pytest process for the whole suite, going on past failures")
    parser.add_argument("--test-timeout", type=float, default=300.0,
                        help="with isolation: seconds one test may run before it is killed with its process, "
                             "recorded as timeout and skipped by the next process (default 300; 0: no limit)")
    parser.add_argument("--out", "-o", type=Path, default=REPO / ".gl" / "upstream-runs",
                        help="output folder (default .gl/upstream-runs)")
    parser.add_argument("--serial", action="store_true",
                        help="run the allocators one after the other (default: side by side, two processes)")
    parser.add_argument("--no-confirm", dest="confirm", action="store_false",
                        help="do not rerun differing tests alone")
    parser.add_argument("--no-site", dest="site", action="store_false",
                        help="shim run: do not put site/sitecustomize.py on PYTHONPATH (test subprocesses then "
                             "run on torch's allocator; the pytest process still gets the shim)")
    parser.add_argument("--slow", action="store_true", help="also torch's @slowTest tests (PYTORCH_TEST_WITH_SLOW=1)")
    parser.add_argument("--python", default=sys.executable, help="the Python that runs pytest (default: this one)")
    parser.add_argument("--resume", action="store_true",
                        help="go on from OUT's results.jsonl: tests already ended are not run again (a test that "
                             "started twice without ending counts as a timeout); for machines that limit one "
                             "command's time: repeat the same command with --resume until nothing is left")
    parser.add_argument("--compare-only", action="store_true",
                        help="run nothing: compare the results already under --out")
    parser.add_argument("--suite-file", metavar="PATH",
                        help="for the runner's own tests: run the pytest file PATH (relative to UPSTREAM, under "
                             "its test/ folder) as the only suite, named after the file, with no selection")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments, after --")
    args = parser.parse_args(argv)
    args.allocators = ALLOCATORS if args.allocator == "both" else (args.allocator,)
    if args.suite_file:
        args.table = {Path(args.suite_file).stem: (args.suite_file, None)}
        args.suites = list(args.table)
    else:
        args.table = SUITES
        args.suites = args.suite or list(SUITES)
    return args


def selection(suite: str, args) -> str | None:
    parts = []
    default = args.table[suite][1]
    if default and not args.whole:
        parts.append(f"({default})")
    parts += [f"({k})" for k in args.keywords]
    return " and ".join(parts) or None


def load_run(suite: str, allocator: str, out: Path) -> Run:
    run = Run(suite, allocator, out / suite / allocator)
    junit, jsonl, report = run.out / "junit.xml", run.out / "results.jsonl", run.out / "report.json"
    if jsonl.exists():  # the whole run, resumed parts included
        run.results = parse_jsonl(jsonl)
    elif junit.exists():
        run.results = parse_junit(junit)
    if report.exists():
        run.report = json.loads(report.read_text())
    return run


def main(argv=None) -> int:
    args = parse_args(argv)
    upstream = args.upstream.resolve()
    out = args.out.resolve()
    missing = [args.table[s][0] for s in args.suites if not (upstream / args.table[s][0]).exists()]
    if missing and not args.compare_only:
        print(f"run_suites: not under {upstream}: {', '.join(missing)} (see tests/upstream/SOURCES.txt)",
              file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    lock = threading.Lock()

    def log(line: str) -> None:
        with lock:
            print(line, flush=True)

    started = time.time()
    log(f"run_suites: {', '.join(args.suites)} under {', '.join(args.allocators)}"
        f" ({'one after the other' if args.serial else 'side by side'}), timeout {args.timeout:.0f}s a run"
        + (f" (a pytest process per failure, {args.test_timeout:.0f}s a test)" if args.isolate else
           " (one pytest process)") + f", output {out}")
    comparison = {"meta": {}, "suites": {}}
    for suite in args.suites:
        keywords = selection(suite, args)
        if args.compare_only:
            runs = {a: load_run(suite, a, out) for a in args.allocators}
        else:
            log(f"[{time.strftime('%H:%M:%S')}] {suite}: {args.table[suite][0]}" + (f" selecting {keywords!r}" if keywords else ""))
            runs = run_suite_allocators(suite, upstream, args.allocators, keywords, out, args, log, args.serial)
        block = compare({a: r.results for a, r in runs.items()})
        block["runs"] = {a: {"returncode": r.returncode, "timed_out": r.timed_out, "elapsed_s": round(r.elapsed, 1),
                             "allocator_backend": r.report.get("allocator_backend"),
                             "versions": r.report.get("versions"), "error": r.report.get("error"),
                             "shim_findings": r.report.get("finding_count"),
                             "processes": r.processes, "restarts": r.restarts,
                             "tests_with_findings": sorted(r.report.get("findings", {}))[:50]}
                         for a, r in runs.items()}
        block["selection"] = keywords
        if args.confirm and not args.compare_only and len(args.allocators) > 1 and block["differences"]:
            log(f"{suite}: {len(block['differences'])} differences; running each alone to confirm")
            confirm(suite, block, upstream, out, args, log)
        comparison["suites"][suite] = block
    comparison["meta"] = {"upstream": str(upstream), "allocators": list(args.allocators),
                          "elapsed_s": round(time.time() - started, 1),
                          "side_by_side": not args.serial, "isolated": args.isolate}
    (out / "comparison.json").write_text(json.dumps(comparison, indent=1, default=lambda o: o.__dict__))
    markdown = render_markdown(comparison)
    (out / "comparison.md").write_text(markdown)
    print()
    print(markdown)
    same = all(block["same_pass_set"] for block in comparison["suites"].values())
    print(f"run_suites: {'the same pass set' if same else 'the pass sets DIFFER'} under "
          f"{' and '.join(args.allocators)}; {out / 'comparison.md'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
