#!/usr/bin/env bash
# Diagnosis of the corpus GPU test (test_single_gpu_programs: prefetch_loader
# FAILED, offload_activations ran to the group's limit, no report kept): each
# example run as helpers/corpus_helpers.run_single runs it (pipes, the test's
# env, PYTEST_CURRENT_TEST), printing the child's stderr; prefetch_loader with
# a cold GPU-trace-bridge cache (this child compiles it) then warm with
# warnings shown; offload_activations with a hang's gdb backtrace and
# faulthandler dump, then with the pure-Python parts; last the test itself
# under pytest, its child's output kept.  After `python3 setup.py build_ext
# --inplace`, from the repo root; files under $OUT.  DEV=sim tries it on CPU.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/corpus_diag} DEV=${DEV:-cuda}; mkdir -p $OUT; T0=$SECONDS
python3 - <<'PY'
import os, shutil, signal, subprocess, sys, time; sys.path.insert(0, "tests")
from helpers.corpus_helpers import ROOT, _env  # the test's env: PYTHONWARNINGS=ignore, NCCL_NVLS_ENABLE=0, PYTHONPATH
OUT, T = os.environ["OUT"], "tests/corpus/test_gpu_corpus.py::test_single_gpu_programs[%s] (call)"
def child(tag, name, steps, limit, gdb=False, **extra):  # run_single's call (pipes, env, cwd); on a hang: gdb, then faulthandler
    env = {**_env(), "PYTHONFAULTHANDLER": "1", "PYTEST_CURRENT_TEST": T % name, "PYTEST_VERSION": "8", **extra}
    p = subprocess.Popen([sys.executable, str(ROOT / "examples" / f"{name}.py"), "--device", os.environ["DEV"], "--steps", steps],
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    t, hung = time.time(), False
    try: out, err = p.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        hung = True
        if gdb and shutil.which("gdb"):
            with open(f"{OUT}/{tag}.gdb", "w") as f:
                subprocess.run(["gdb", "-p", str(p.pid), "-batch", "-ex", "thread apply all bt 25"], stdout=f, stderr=subprocess.STDOUT, timeout=60)
        p.send_signal(signal.SIGABRT); out, err = p.communicate(timeout=30)  # PYTHONFAULTHANDLER: every thread's Python stack
    open(f"{OUT}/{tag}.out", "w").write(out); open(f"{OUT}/{tag}.err", "w").write(err)
    print(f"===== {tag}: rc={p.returncode} hung={hung} {time.time() - t:.0f} s; stdout: {out[-600:]}"
          f"\n----- stderr ({len(err)} chars; whole in $OUT/{tag}.err):\n{err[:1500] if hung else err[-2500:]}", flush=True)
cold = f"{OUT}/bridge_cache"  # empty: this child builds the GPU trace bridge, as a first sanitizer on a fresh machine does
child("prefetch_as_test_cold_bridge", "prefetch_loader", "20", 75, NPU_LIFETIME_CACHE=cold)
child("prefetch_warm_warnings_shown", "prefetch_loader", "20", 45, NPU_LIFETIME_CACHE=cold, PYTHONWARNINGS="default")
child("offload_warnings_shown", "offload_activations", "5", 40, gdb=True, NPU_LIFETIME_CACHE=cold, PYTHONWARNINGS="default")
child("offload_python_parts", "offload_activations", "5", 25, PYTHONWARNINGS="default", NPU_LIFETIME_NATIVE="0")
PY
ls -l $OUT/bridge_cache; grep -hE "^Thread|^#" $OUT/*.gdb 2>/dev/null | cut -c1-150 | head -70
NPU_LIFETIME_TEST_LOGS=$OUT/pytest_children timeout 80 python3 -m pytest -q -x -p no:cacheprovider tests/corpus/test_gpu_corpus.py -k prefetch 2>&1 | tail -15
tail -c 1500 $OUT/pytest_children/*.stderr 2>/dev/null; echo "== total $((SECONDS-T0)) s"
