"""benchmarks/bench_dispatch_floor.py at its smallest: every variant is timed,
and each C++ variant's fallback was entered once per op the workload ran
(Python reached once per op, the walk seeing the one in-place write per step)."""
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "bench_dispatch_floor.py"
STEPS = 2


def _bench_module():
    spec = importlib.util.spec_from_file_location("bench_dispatch_floor_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_smallest_run_times_every_variant_and_the_fallback_sees_every_op():
    bench = _bench_module()
    missing = bench.missing_tools()
    if missing:
        pytest.skip(f"cannot build the C++ fallback: {missing}")
    done = subprocess.run([sys.executable, str(SCRIPT), "--rounds", "1", "--steps", str(STEPS), "--repeats", "1"],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    for variant in bench.VARIANTS:
        assert re.search(rf"^{re.escape(variant)} +\d", out, re.M), f"no row for {variant}:\n{out}"
    ops = STEPS * bench.OPS_PER_STEP
    assert f"{ops} CPU ops per run" in out and "dispatch key DeferredInit" in out
    for variant in bench.CPP_WORK:
        entered = re.search(rf"^{variant}: fallback entered for (\d+) of (\d+) ops dispatched "
                            r"\(Python called (\d+), writes walked (\d+)\)", out, re.M)
        assert entered, f"no fallback line for {variant}:\n{out}"
        seen, dispatched, python_calls, writes = map(int, entered.groups())
        assert seen == dispatched == ops
        assert python_calls == (ops if variant == "cpp-python-call" else 0)
        assert writes == (STEPS * bench.WRITES_PER_STEP if variant == "cpp-walk" else 0)


def test_without_a_compiler_the_script_says_so_and_stops(tmp_path):
    env = {"PATH": str(tmp_path), "CXX": "no-such-compiler", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(SCRIPT), "--rounds", "1", "--steps", "1", "--repeats", "1"],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "skipped: no C++ compiler (no-such-compiler) on PATH" in done.stderr
    assert "variant" not in done.stdout
