#!/usr/bin/env python3
"""Runs torch's own allocator tests under torch's allocator and under the
shim, and compares the outcomes (issue 16).

    python3 tests/upstream/run_suites.py .gl/upstream --out .gl/upstream-runs

runs every suite of SUITES (the upstream files, fetched as
tests/upstream/SOURCES.txt says, under UPSTREAM/test/...) once with
NPU_LIFETIME_UPSTREAM_ALLOCATOR=native and once with =shim, the two
allocators side by side as two pytest processes (--serial: one after the
other), each suite under its own timeout.  Then the tests whose outcome
differs are run once more, alone and one allocator after the other, so that
a difference caused by the two runs sharing the GPU is told apart
(--no-confirm skips that).

Prints a line per finished suite and allocator, then the counts per
allocator and every difference with the head of its failure message; the
same goes to OUT/comparison.json and OUT/comparison.md.  Exit status 0 when
the pass sets are the same, 1 when they differ, 2 on a usage error.

Torch-free on purpose (the comparison is unit-tested on CPU in
tests/test_upstream_runner.py): torch is only imported by the pytest
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
    its timeout (no junit file); a test that started and never ended is a
    timeout."""
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
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            run.returncode = proc.returncode
    run.elapsed = time.time() - start
    junit, jsonl, report = run.out / "junit.xml", run.out / "results.jsonl", run.out / "report.json"
    if junit.exists() and not run.timed_out and not resume:
        run.results = parse_junit(junit)
    elif jsonl.exists():
        run.results = parse_jsonl(jsonl)
    if report.exists():
        run.report = json.loads(report.read_text())
    tally = counts(run.results)
    state = "TIMED OUT" if run.timed_out else f"exit {run.returncode}"
    log(f"[{time.strftime('%H:%M:%S')}] {run.suite} / {run.allocator}: {state} after {run.elapsed:.0f}s: "
        + ", ".join(f"{tally[o]} {o}" for o in OUTCOMES if tally[o]) + f" ({tally['total']} tests)"
        + (f"; shim findings: {run.report.get('finding_count')}" if run.allocator == "shim" and run.report else "")
        + ("" if run.results else f"; no results, see {run.out / 'pytest.log'}"))
    return run


def run_suite_allocators(suite: str, upstream: Path, allocators, keywords, out: Path, args, log,
                         serial: bool, extra=()) -> dict:
    path = SUITES[suite][0]
    runs = {}
    threads = []
    for allocator in allocators:
        run_out = out / suite / allocator
        run = Run(suite, allocator, run_out)
        command = pytest_command(args.python, upstream, path, run_out / "junit.xml",
                                 list(args.pytest_args) + list(extra))
        env = environment(allocator, upstream, run_out, args.slow, args.site, args.python, keywords)
        runs[allocator] = run
        if serial:
            run_one(run, command, env, args.timeout, log, args.resume)
        else:
            thread = threading.Thread(target=run_one, args=(run, command, env, args.timeout, log, args.resume))
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
    path = SUITES[suite][0]
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
                        help="seconds one suite under one allocator may run before it is killed (default 3600)")
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
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments, after --")
    args = parser.parse_args(argv)
    args.allocators = ALLOCATORS if args.allocator == "both" else (args.allocator,)
    args.suites = args.suite or list(SUITES)
    return args


def selection(suite: str, args) -> str | None:
    parts = []
    default = SUITES[suite][1]
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
    missing = [SUITES[s][0] for s in args.suites if not (upstream / SUITES[s][0]).exists()]
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
        f" ({'one after the other' if args.serial else 'side by side'}), timeout {args.timeout:.0f}s a run,"
        f" output {out}")
    comparison = {"meta": {}, "suites": {}}
    for suite in args.suites:
        keywords = selection(suite, args)
        if args.compare_only:
            runs = {a: load_run(suite, a, out) for a in args.allocators}
        else:
            log(f"[{time.strftime('%H:%M:%S')}] {suite}: {SUITES[suite][0]}" + (f" selecting {keywords!r}" if keywords else ""))
            runs = run_suite_allocators(suite, upstream, args.allocators, keywords, out, args, log, args.serial)
        block = compare({a: r.results for a, r in runs.items()})
        block["runs"] = {a: {"returncode": r.returncode, "timed_out": r.timed_out, "elapsed_s": round(r.elapsed, 1),
                             "allocator_backend": r.report.get("allocator_backend"),
                             "versions": r.report.get("versions"), "error": r.report.get("error"),
                             "shim_findings": r.report.get("finding_count"),
                             "tests_with_findings": sorted(r.report.get("findings", {}))[:50]}
                         for a, r in runs.items()}
        block["selection"] = keywords
        if args.confirm and not args.compare_only and len(args.allocators) > 1 and block["differences"]:
            log(f"{suite}: {len(block['differences'])} differences; running each alone to confirm")
            confirm(suite, block, upstream, out, args, log)
        comparison["suites"][suite] = block
    comparison["meta"] = {"upstream": str(upstream), "allocators": list(args.allocators),
                          "elapsed_s": round(time.time() - started, 1),
                          "side_by_side": not args.serial}
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
