#!/usr/bin/env bash
# The sanitizer's GPU tests in one command that builds everything (one GPU;
# the two-GPU cases skip).  Log under $OUT.
#   tools/gpu_sanitizer_tests.sh [extra pytest args]
set -u
OUT=${OUT:-/tmp/gpu_out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  cat COMMIT 2>/dev/null || git rev-parse HEAD
  python3 -c "import torch; print('torch', torch.__version__)"; } | tee "$OUT/machine.txt"
T0=$SECONDS; python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
# the GPU trace bridge, built against this torch before any timing (it is cached)
python3 -c "from npu_lifetime.shim import bridge; print('trace bridge:', bridge.build(name=bridge.GPU_TRACE_BRIDGE))" \
  >> "$OUT/machine.txt" 2>&1
echo "build $((SECONDS-T0)) s"
timeout "${TEST_LIMIT:-540}" python3 -m pytest -q -rfEs -p no:cacheprovider --durations=10 \
  tests/sanitizer/test_gpu_sanitizer.py tests/sanitizer/test_gpu_verdicts.py tests/corpus/test_gpu_corpus.py tests/recording/test_gpu_handoff.py \
  tests/sanitizer/test_event_hook.py tests/sanitizer/test_trace_feed.py tests/sanitizer/test_native_parity.py tests/sanitizer/test_host_lock.py \
  tests/sanitizer/test_sanitizer_reports.py tests/cli/test_gpu_bad_inputs.py tests/sanitizer/test_dispatch_native_edges.py tests/sanitizer/test_event_feed.py tests/sanitizer/test_trace_bridge.py \
  tests/sanitizer/test_gpu_sanitizer_default_raise.py tests/sanitizer/test_sanitizer_seam_faults.py tests/sanitizer/test_sanitizer_threads.py \
  tests/sanitizer/test_sanitizer_odd_tensors.py "$@" > "$OUT/gpu_tests.log" 2>&1
echo "tests rc=$? $((SECONDS-T0)) s"; grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.log" | head -30; tail -2 "$OUT/gpu_tests.log"
