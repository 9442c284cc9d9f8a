#!/usr/bin/env bash
# Issue 36 on one GPU, in one command that builds everything: the default
# raise and worker-thread tests, the sanitizer's core GPU tests, then the
# sanitizer's cost against CSAN (the chain and the transformer step, CSAN in
# the same run).  Logs under $OUT.
#   tools/gpu_issue36.sh          (CHAIN_ROUNDS, TRAIN_ROUNDS, TEST_LIMIT to change)
set -u
OUT=${OUT:-/tmp/gpu_out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  git rev-parse HEAD 2>/dev/null; python3 -c "import sys, torch; print('torch', torch.__version__, sys.version.split()[0])"; } \
  | tee "$OUT/machine.txt"
T0=$SECONDS; python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
python3 -c "from npu_lifetime.shim import bridge; print('trace bridge:', bridge.build(name=bridge.GPU_TRACE_BRIDGE))" \
  >> "$OUT/machine.txt" 2>&1
python3 -c "import npu_lifetime.sanitizer.native as n; print('native parts:', n.in_use())" | tee -a "$OUT/machine.txt"
echo "build $((SECONDS-T0)) s"
timeout "${TEST_LIMIT:-240}" python3 -m pytest -q -rfEs -p no:cacheprovider \
  tests/sanitizer/test_gpu_sanitizer_default_raise.py tests/sanitizer/test_sanitizer_seam_faults.py tests/sanitizer/test_sanitizer_threads.py \
  tests/sanitizer/test_sanitizer_odd_tensors.py tests/sanitizer/test_sanitizer_read_backs.py tests/sanitizer/test_sanitizer_bad_arguments.py \
  tests/sanitizer/test_gpu_sanitizer.py tests/sanitizer/test_trace_bridge.py tests/sanitizer/test_native_switch.py > "$OUT/gpu_tests.log" 2>&1
echo "tests rc=$? $((SECONDS-T0)) s"; grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.log" | head -20; tail -2 "$OUT/gpu_tests.log"
bench() { local name=$1 limit=$2; shift 2; local t=$SECONDS
  timeout "$limit" python3 "$@" > "$OUT/$name.log" 2>&1; echo "== $name rc=$? $((SECONDS-t)) s"; tail -"${TAILN:-8}" "$OUT/$name.log"; }
R=${CHAIN_ROUNDS:-3}; TR=${TRAIN_ROUNDS:-1}
TAILN=12 bench bench_sanitizer $((45 * R + 30)) benchmarks/bench_sanitizer.py --rounds "$R" --steps 200 --repeats 5
bench bench_training_transformer $((60 * TR + 50)) benchmarks/bench_training.py --model transformer --rounds "$TR" --steps 5 --repeats 3
echo "total $((SECONDS-T0)) s"
