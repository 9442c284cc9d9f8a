"""tests/upstream/run_suites.py's junit/jsonl parsing and its comparison,
on small synthetic files (torch-free: the runner itself runs on a GPU
machine, by hand)."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

RUNNER = Path(__file__).resolve().parents[1] / "upstream" / "run_suites.py"
_spec = importlib.util.spec_from_file_location("upstream_run_suites", RUNNER)
rs = importlib.util.module_from_spec(_spec)
sys.modules["upstream_run_suites"] = rs
_spec.loader.exec_module(rs)


def junit(tmp_path, name, cases: str):
    path = tmp_path / name
    path.write_text(f'<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">{cases}'
                    "</testsuite></testsuites>")
    return path


NATIVE = """
<testcase classname="test.test_cuda.TestCuda" name="test_a" time="0.1"/>
<testcase classname="test.test_cuda.TestCuda" name="test_b" time="0.1"/>
<testcase classname="test.test_cuda.TestCuda" name="test_c" time="0.1"><skipped type="pytest.skip" message="needs 2 GPUs">skip</skipped></testcase>
<testcase classname="test.test_cuda.TestCuda" name="test_d" time="0.1"><skipped type="pytest.xfail" message="expected"/></testcase>
<testcase classname="test.test_cuda.TestMemPool" name="test_e" time="0.1"/>
"""
SHIM = """
<testcase classname="test.test_cuda.TestCuda" name="test_a" time="0.1"/>
<testcase classname="test.test_cuda.TestCuda" name="test_b" time="0.1"><failure message="AssertionError: 1 != 2">Traceback
  File "x.py", line 3
AssertionError: 1 != 2</failure></testcase>
<testcase classname="test.test_cuda.TestCuda" name="test_c" time="0.1"><skipped type="pytest.skip" message="needs 2 GPUs">skip</skipped></testcase>
<testcase classname="test.test_cuda.TestCuda" name="test_d" time="0.1"><skipped type="pytest.xfail" message="expected"/></testcase>
<testcase classname="test.test_cuda.TestMemPool" name="test_e" time="0.1"/>
<testcase classname="test.test_cuda.TestMemPool" name="test_e" time="0.1"><error message="failed on teardown">leak</error></testcase>
<testcase classname="test.test_cuda.TestMemPool" name="test_f" time="0.1"/>
"""


def test_parse_junit_outcomes(tmp_path):
    native = rs.parse_junit(junit(tmp_path, "n.xml", NATIVE))
    shim = rs.parse_junit(junit(tmp_path, "s.xml", SHIM))
    assert native["test.test_cuda.TestCuda::test_a"].outcome == "passed"
    assert native["test.test_cuda.TestCuda::test_c"].outcome == "skipped"
    assert native["test.test_cuda.TestCuda::test_d"].outcome == "xfailed"
    assert shim["test.test_cuda.TestCuda::test_b"].outcome == "failed"
    assert "AssertionError: 1 != 2" in shim["test.test_cuda.TestCuda::test_b"].message
    # a passed call followed by a teardown error is an error
    assert shim["test.test_cuda.TestMemPool::test_e"].outcome == "error"
    assert rs.counts(native) == {"passed": 3, "failed": 0, "error": 0, "skipped": 1, "xfailed": 1, "timeout": 0,
                                 "total": 5}
    assert rs.counts(shim)["total"] == 6


def test_compare_lists_every_difference(tmp_path):
    native = rs.parse_junit(junit(tmp_path, "n.xml", NATIVE))
    shim = rs.parse_junit(junit(tmp_path, "s.xml", SHIM))
    comparison = rs.compare({"native": native, "shim": shim})
    assert not comparison["same_pass_set"]
    diffs = {d["test"]: d for d in comparison["differences"]}
    assert set(diffs) == {"test.test_cuda.TestCuda::test_b", "test.test_cuda.TestMemPool::test_e",
                          "test.test_cuda.TestMemPool::test_f"}
    assert diffs["test.test_cuda.TestMemPool::test_f"]["outcomes"] == {"native": "absent", "shim": "passed"}
    assert "1 != 2" in diffs["test.test_cuda.TestCuda::test_b"]["messages"]["shim"]
    markdown = rs.render_markdown({"suites": {"test_cuda": comparison}})
    assert "same pass set: NO; differences: 3" in markdown
    assert "| native | 3 | 0 | 0 | 1 | 1 | 0 | 5 |" in markdown


def test_same_runs_compare_equal(tmp_path):
    native = rs.parse_junit(junit(tmp_path, "n.xml", NATIVE))
    again = rs.parse_junit(junit(tmp_path, "m.xml", NATIVE))
    comparison = rs.compare({"native": native, "shim": again})
    assert comparison["same_pass_set"] and comparison["differences"] == []


def test_jsonl_of_a_killed_run(tmp_path):
    lines = [
        {"event": "start", "nodeid": "test/test_cuda.py::TestCuda::test_a"},
        {"event": "report", "nodeid": "test/test_cuda.py::TestCuda::test_a", "when": "call", "outcome": "passed"},
        {"event": "end", "nodeid": "test/test_cuda.py::TestCuda::test_a"},
        {"event": "start", "nodeid": "test/test_cuda.py::TestCuda::test_b"},
        {"event": "report", "nodeid": "test/test_cuda.py::TestCuda::test_b", "when": "setup", "outcome": "failed",
         "message": "boom"},
        {"event": "end", "nodeid": "test/test_cuda.py::TestCuda::test_b"},
        {"event": "start", "nodeid": "test/test_cuda.py::TestCuda::test_hang"},
    ]
    path = tmp_path / "results.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + '\n{"event": "rep')
    results = rs.parse_jsonl(path)
    assert {k: r.outcome for k, r in results.items()} == {
        "test.test_cuda.TestCuda::test_a": "passed",
        "test.test_cuda.TestCuda::test_b": "error",
        "test.test_cuda.TestCuda::test_hang": "timeout",
    }


def test_node_ids_and_selection(tmp_path):
    assert rs.nodeid_to_id("test/inductor/test_cudagraph_trees.py::CudaGraphTreeTests::test_x") == \
        "test.inductor.test_cudagraph_trees.CudaGraphTreeTests::test_x"
    node = rs._node_for("test.test_cuda.TestCuda::test_x", tmp_path, "test/test_cuda.py")
    assert node == f"{tmp_path}/test/test_cuda.py::TestCuda::test_x"
    args = rs.parse_args([str(tmp_path), "-k", "graph", "--allocator", "shim", "--serial"])
    assert args.allocators == ("shim",) and args.serial and args.suites == list(rs.SUITES)
    trees = rs.selection("test_cudagraph_trees", args)
    assert trees.endswith(" and (graph)") and all(f"not {name}" in trees for name in rs.AFTER_2_11)
    assert "not TestCudaMallocAsync" in rs.selection("test_cuda", args)
    assert rs.selection("test_cuda", rs.parse_args([str(tmp_path), "--whole"])) is None


def test_help_and_missing_upstream(tmp_path):
    out = subprocess.run([sys.executable, str(RUNNER), "--help"], capture_output=True, text=True, check=True)
    assert "--allocator" in out.stdout and "--timeout" in out.stdout
    missing = subprocess.run([sys.executable, str(RUNNER), str(tmp_path), "--out", str(tmp_path / "o")],
                             capture_output=True, text=True)
    assert missing.returncode == 2 and "SOURCES.txt" in missing.stderr


def test_compare_only_on_saved_runs(tmp_path):
    for allocator, cases in (("native", NATIVE), ("shim", SHIM)):
        folder = tmp_path / "o" / "test_cuda" / allocator
        folder.mkdir(parents=True)
        junit(folder, "junit.xml", cases)
    out = subprocess.run([sys.executable, str(RUNNER), str(tmp_path), "--out", str(tmp_path / "o"),
                          "--compare-only", "-s", "test_cuda"], capture_output=True, text=True)
    assert out.returncode == 1, out.stderr
    assert "test.test_cuda.TestCuda::test_b" in out.stdout
    saved = json.loads((tmp_path / "o" / "comparison.json").read_text())
    assert len(saved["suites"]["test_cuda"]["differences"]) == 3


def test_selection_matches_class_and_test_names_only():
    """The plugin's selection ignores the file's path (pytest's -k would match
    ".gl/upstream" against "stream" and select every test)."""
    sys.path.insert(0, str(RUNNER.parent))
    try:
        import shim_plugin
    finally:
        sys.path.remove(str(RUNNER.parent))
    expression = rs.SUITES["test_cuda"][1]
    picks = {
        ".gl/upstream/test/test_cuda.py::TestCudaArchList::test_get_arch_list_empty_when_cuda_not_compiled": False,
        ".gl/upstream/test/test_cuda.py::TestCuda::test_record_stream": True,
        ".gl/upstream/test/test_cuda.py::TestCuda::test_cublas_allow_tf32_get_set": False,
        ".gl/upstream/test/test_cuda.py::TestMemPool::test_mempool_id": True,
        ".gl/upstream/test/test_cuda.py::TestCudaAllocator::test_allocator_fuzz": True,
        ".gl/upstream/test/test_cuda.py::TestBlockStateAbsorption::test_simple": True,
        ".gl/upstream/test/test_cuda.py::TestCudaMallocAsync::test_memory_snapshot": False,
        ".gl/upstream/test/test_cuda.py::TestCuda::test_cachingAllocator_raw_alloc": True,
        ".gl/upstream/test/test_cuda.py::TestCudaAutocast::test_autocast_rnn": False,
    }
    for nodeid, expected in picks.items():
        assert shim_plugin.selected(nodeid, expression) is expected, nodeid
    assert shim_plugin.selected("a/b.py::C::test_x", "test_x and not C2")


def test_resume_skips_ended_and_twice_started_tests(tmp_path):
    sys.path.insert(0, str(RUNNER.parent))
    try:
        import shim_plugin
    finally:
        sys.path.remove(str(RUNNER.parent))
    path = tmp_path / "results.jsonl"
    events = [("start", "f.py::C::a"), ("end", "f.py::C::a"), ("start", "f.py::C::b"),  # b was killed once
              ("start", "f.py::C::c"), ("start", "f.py::C::c")]  # c hung twice
    path.write_text("".join(json.dumps({"event": e, "nodeid": n}) + "\n" for e, n in events) + "{cut")
    assert shim_plugin.finished_earlier(str(path)) == {"f.py::C::a", "f.py::C::c"}
    assert shim_plugin.finished_earlier(str(tmp_path / "none.jsonl")) == set()


# ------------------------------------------------- failure isolation (stepcurrent)
#
# The real pipeline (run_suites.py -> pytest -p shim_plugin) on a synthetic
# suite, --allocator native: no torch, no CUDA.  Test 2 "poisons" its
# process (as a failed CUDA graph capture does: every later graph test of
# the process then fails), so tests 3-5 pass only in a fresh process.

POISON = """
import time

STATE = {"poisoned": False}


def test_1():
    pass


def test_2():
    STATE["poisoned"] = True
    assert False, "fails and leaves the process poisoned"


def test_3():
    assert not STATE["poisoned"], "poisoned by test_2"


def test_4():
    assert not STATE["poisoned"], "poisoned by test_2"


def test_5():
    assert not STATE["poisoned"], "poisoned by test_2"
"""

# test_1 hangs, test_2 fails and poisons, test_3 kills its process
HANG = (POISON.replace('def test_1():\n    pass', 'def test_1():\n    time.sleep(60)')
        .replace('def test_3():\n', 'def test_3():\n    import os\n    os._exit(3)\n'))

SLOW_FAILURES = "".join(f"\n\ndef test_{i}():\n    import time\n    time.sleep(1)\n    assert False\n"
                        for i in range(1, 6))


def run_synthetic(tmp_path, source: str, *options):
    """run_suites.py on test/test_synth.py holding ``source``: its stdout and
    {test name: Result}, and the start count of each test."""
    upstream = tmp_path / "up"
    (upstream / "test").mkdir(parents=True, exist_ok=True)
    (upstream / "test" / "test_synth.py").write_text(source)
    out = tmp_path / "o"
    proc = subprocess.run([sys.executable, str(RUNNER), str(upstream), "--suite-file", "test/test_synth.py",
                           "--allocator", "native", "--no-confirm", "--out", str(out), *options],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run = rs.load_run("test_synth", "native", out)
    results = {key.rpartition("::")[2]: r for key, r in run.results.items()}
    starts: dict = {}
    for line in (out / "test_synth" / "native" / "results.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["event"] == "start":
            starts[record["nodeid"]] = starts.get(record["nodeid"], 0) + 1
    comparison = json.loads((out / "comparison.json").read_text())
    return proc.stdout, results, starts, comparison["suites"]["test_synth"]["runs"]["native"]


def outcomes(results):
    return {name: r.outcome for name, r in sorted(results.items())}


def test_without_isolation_a_poisoned_process_fails_the_tests_after(tmp_path):
    stdout, results, starts, run = run_synthetic(tmp_path, POISON, "--no-isolate")
    assert outcomes(results) == {"test_1": "passed", "test_2": "failed", "test_3": "failed", "test_4": "failed",
                                 "test_5": "failed"}
    assert "poisoned by test_2" in results["test_4"].message
    assert "restart" not in stdout and run["processes"] == 1


def test_isolation_restarts_after_the_failing_test(tmp_path):
    stdout, results, starts, run = run_synthetic(tmp_path, POISON)  # the default
    assert outcomes(results) == {"test_1": "passed", "test_2": "failed", "test_3": "passed", "test_4": "passed",
                                 "test_5": "passed"}
    assert "fails and leaves the process poisoned" in results["test_2"].message  # its own result stays
    assert "test_synth / native: restart 1 after test_synth.py::test_2 failed, 3 tests left" in stdout
    assert stdout.count("restart ") == 1 and run["processes"] == 2
    assert set(starts.values()) == {1} and len(starts) == 5  # nothing ran twice


def test_isolation_kills_a_hanging_test_and_goes_on(tmp_path):
    """A hanging test is killed with its process and recorded as timeout, a
    test whose process dies under it as error; neither runs again."""
    stdout, results, starts, run = run_synthetic(tmp_path, HANG, "--test-timeout", "1")
    assert outcomes(results) == {"test_1": "timeout", "test_2": "failed", "test_3": "error", "test_4": "passed",
                                 "test_5": "passed"}
    assert "--test-timeout" in results["test_1"].message
    assert "exit 3" in results["test_3"].message
    assert "restart 1 after test_synth.py::test_1 timed out (> 1s), 4 tests left" in stdout
    assert "restart 2 after test_synth.py::test_2 failed, 3 tests left" in stdout
    assert "restart 3 after test_synth.py::test_3 crashed its process (exit 3), 2 tests left" in stdout
    assert set(starts.values()) == {1} and len(starts) == 5 and run["processes"] == 4


def test_the_timeout_is_for_the_whole_loop(tmp_path):
    """Every test fails after 1 s, each in its own process: 5 s of tests
    at least, so --timeout 3 ends the loop before the last one (a timeout
    per process would let each of the five processes finish)."""
    stdout, results, starts, run = run_synthetic(tmp_path, SLOW_FAILURES, "--timeout", "3")
    assert run["timed_out"] and len(results) < 5, stdout
    assert "TIMED OUT" in stdout
    assert set(starts.values()) == {1}


def test_isolation_options(tmp_path):
    assert rs.parse_args([str(tmp_path)]).isolate
    assert not rs.parse_args([str(tmp_path), "--no-isolate"]).isolate
    assert rs.parse_args([str(tmp_path), "--no-isolate", "--isolate-failures"]).isolate
    args = rs.parse_args([str(tmp_path), "--suite-file", "test/test_x.py"])
    assert args.suites == ["test_x"] and rs.selection("test_x", args) is None


def test_jsonl_killed_lines(tmp_path):
    lines = [{"event": "collected", "nodeids": ["f.py::a", "f.py::b"]},
             {"event": "start", "nodeid": "f.py::a"},
             {"event": "killed", "nodeid": "f.py::a", "outcome": "timeout", "message": "ran longer"},
             {"event": "start", "nodeid": "f.py::b"},
             {"event": "killed", "nodeid": "f.py::b", "outcome": "error", "message": "process ended"}]
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    results = rs.parse_jsonl(path)
    assert {k: (r.outcome, r.message) for k, r in results.items()} == {
        "f::a": ("timeout", "ran longer"), "f::b": ("error", "process ended")}
    sys.path.insert(0, str(RUNNER.parent))
    try:
        import shim_plugin
    finally:
        sys.path.remove(str(RUNNER.parent))
    assert shim_plugin.finished_earlier(str(path)) == {"f.py::a", "f.py::b"}


def test_each_allocators_run_builds_torch_extensions_in_a_folder_of_its_own(tmp_path):
    """Side by side, torch's tests under both allocators built test_cuda.py's
    dummy allocators into one cache folder; under torch's allocator two tests
    then loaded the other run's build ("undefined symbol: called_dummy_alloc")."""
    folders = {rs.environment(a, tmp_path, tmp_path / a, slow=False)["TORCH_EXTENSIONS_DIR"] for a in rs.ALLOCATORS}
    assert len(folders) == len(rs.ALLOCATORS)
    assert all(str(tmp_path) in f for f in folders)
