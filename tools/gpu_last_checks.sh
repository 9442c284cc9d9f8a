#!/usr/bin/env bash
# The session's last GPU call, in one command that builds everything: the
# sanitizer's GPU tests and the corpus's prefetch_loader under the C parts
# and the pure-Python ones (NPU_LIFETIME_NATIVE=0), side by side; then, on
# the quiet machine, record_use's cost, the allocation hot path and the
# sanitizer's cost with CSAN in the same run.  Logs under $OUT.
set -u
source tools/gpu_prologue.sh
step prefetch_c 150 3 python3 examples/prefetch_loader.py --device cuda --steps 20 &
NPU_LIFETIME_NATIVE=0 step prefetch_python 150 3 python3 examples/prefetch_loader.py --device cuda --steps 20 &
step gpu_sanitizer_tests 150 12 python3 -m pytest -q -rfE -p no:cacheprovider tests/sanitizer/test_gpu_sanitizer.py \
  tests/sanitizer/test_gpu_sanitizer_default_raise.py tests/sanitizer/test_gpu_verdicts.py
wait
step bench_record_use 110 12 python3 benchmarks/bench_record_use.py --device cuda --calls 20000 --rounds 5 \
  --json "$OUT/record_use.json"
step bench_shim_alloc 110 16 python3 benchmarks/bench_shim_alloc.py --rounds 3 --json "$OUT/shim_alloc.json"
step bench_sanitizer 130 12 python3 benchmarks/bench_sanitizer.py --rounds 3 --steps 200 --repeats 3
echo "== total $((SECONDS-T0)) s"
