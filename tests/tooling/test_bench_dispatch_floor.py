"""benchmarks/bench_dispatch_floor.py at its smallest: every variant is timed,
and each C++ variant's fallback was entered once per op the workload ran
(Python reached once per op, the walk seeing the one in-place write per step);
the fallback's key reaches other threads the way autograd's engine passes it."""
import importlib.util
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "bench_dispatch_floor.py"
STEPS = 2
# mm 2, relu 1, add 1, mul_ 1, sum 1, mul 1, tanh 1 (the numbers of `c + 1`, `mul_(0.5)` and `e * 0.1` are not tensors)
TENSORS_PER_STEP = 8


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
                            r"\(Python called (\d+), writes walked (\d+), tensors handed over (\d+), "
                            r"sites captured (\d+)\)", out, re.M)
        assert entered, f"no fallback line for {variant}:\n{out}"
        seen, dispatched, python_calls, writes, tensors, sites = map(int, entered.groups())
        assert seen == dispatched == ops
        assert python_calls == (ops if variant in ("cpp-python-call", "cpp-python-tensors") else 0)
        assert writes == (STEPS * bench.WRITES_PER_STEP if variant == "cpp-walk" else 0)
        assert tensors == (STEPS * TENSORS_PER_STEP if variant == "cpp-python-tensors" else 0)
        assert sites == (ops if variant == "cpp-site" else 0)
    assert re.search(r"^cpp-site's last site: .*bench_dispatch_floor\.py:\d+ in workload$", out, re.M), out


def test_without_a_compiler_the_script_says_so_and_stops(tmp_path):
    env = {"PATH": str(tmp_path), "CXX": "no-such-compiler", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(SCRIPT), "--rounds", "1", "--steps", "1", "--repeats", "1"],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "skipped: no C++ compiler (no-such-compiler) on PATH" in done.stderr
    assert "variant" not in done.stdout


def _built_extension(bench):
    missing = bench.missing_tools()
    if missing:
        pytest.skip(f"cannot build the C++ fallback: {missing}")
    return bench.import_built(bench.build(bench.default_build_dir()))


def test_the_key_reaches_a_thread_through_thread_local_state_only():
    """What autograd's engine threads rely on: the included key travels in
    at::ThreadLocalState; a bare new thread starts without it."""
    floor = _built_extension(_bench_module())
    floor.enable(0)
    try:
        carried = floor.key_in_new_thread()
    finally:
        floor.disable()
    assert carried == (True, False)
    assert floor.key_in_new_thread() == (False, False)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA backward runs on autograd's device threads")
def test_cuda_backward_ops_reach_the_fallback_on_the_engine_thread():
    floor = _built_extension(_bench_module())
    seen = []
    floor.set_on_op(lambda name: seen.append((name, threading.get_ident())))
    x = torch.randn(16, 16, device="cuda", requires_grad=True)
    floor.enable(1)
    try:
        (x @ x).relu().sum().backward()
        torch.cuda.synchronize()
    finally:
        floor.disable()
        floor.set_on_op(None)
    engine_ops = {name for name, thread in seen if thread != threading.get_ident()}
    assert "aten::mm" in engine_ops and "aten::threshold_backward" in engine_ops, seen


def test_a_key_already_taken_makes_the_import_fail_saying_so():
    floor = _built_extension(_bench_module())
    code = ("import importlib.util, sys, torch\n"
            "taken = torch.library.Library('_', 'IMPL')\n"
            "taken.fallback(lambda *args: None, dispatch_key='DeferredInit')\n"
            "spec = importlib.util.spec_from_file_location('dispatch_floor', sys.argv[1])\n"
            "spec.loader.exec_module(importlib.util.module_from_spec(spec))\n")
    done = subprocess.run([sys.executable, "-c", code, floor.__file__], capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert "ImportError: dispatch_floor: cannot register a fallback on DeferredInit" in done.stderr, done.stderr
    assert "Tried to register multiple backend fallbacks" in done.stderr


def test_bad_work_and_a_failing_site_capture_are_errors_not_crashes():
    floor = _built_extension(_bench_module())
    with pytest.raises(ValueError, match="work must be 0 to 4, not 5"):
        floor.enable(5)
    with pytest.raises(TypeError, match="must be callable or None"):
        floor.set_site_capture(3, ())

    def fails():
        raise KeyError("no site here")

    floor.set_site_capture(fails, ())
    x = torch.ones(2)
    floor.enable(4)
    try:
        with pytest.raises(RuntimeError, match="capturing .*relu's site failed"):
            x.relu()
    finally:
        floor.disable()
        floor.set_site_capture(None, ())
    assert floor.take_last_site() is None  # nothing kept from the failed capture
    floor.reset()
    floor.set_site_capture(lambda tag: tag, ("kept",))
    floor.enable(4)
    try:
        x.relu()
    finally:
        floor.disable()
        floor.set_site_capture(None, ())
    assert floor.sites_captured() == 1 and floor.take_last_site() == "kept"
    assert floor.take_last_site() is None
