#!/usr/bin/env bash
# Issue 37's GPU checks in one command that builds everything: the shim's
# entry points against torch's allocator in the same programs (cacheInfo by
# torch's rule included), the shim's GPU tests, and the allocation hot path
# against torch's allocator (benchmarks/bench_shim_alloc.py).  Logs under $OUT.
set -u
OUT=${OUT:-/tmp/gpu_out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
T0=$SECONDS
[ -e npu_lifetime/_native/libnpl*.so ] || python3 setup.py build_ext --inplace > "$OUT/build37.log" 2>&1 \
  || { tail -30 "$OUT/build37.log"; exit 1; }
timeout "${TEST_LIMIT:-330}" python3 -m pytest -q -rfEs -p no:cacheprovider tests/shim/test_gpu_entry_points.py \
  tests/shim/test_gpu_shim.py tests/shim/test_gpu_capture_reuse.py tests/recording/test_gpu_record_use.py tests/shim/test_gpu_dropin.py \
  > "$OUT/gpu_tests37.log" 2>&1
echo "tests rc=$? $((SECONDS-T0)) s"; grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests37.log" | head -20; tail -2 "$OUT/gpu_tests37.log"
timeout 150 python3 benchmarks/bench_shim_alloc.py > "$OUT/bench_shim_alloc.log" 2>&1
echo "== bench_shim_alloc rc=$? $((SECONDS-T0)) s"; tail -14 "$OUT/bench_shim_alloc.log"
