#!/usr/bin/env bash
# Issues 37 and 39's GPU figures in one command that builds everything, on
# a quiet machine: cross_stream (reuse against torch's allocator and
# cudaMallocAsync), record_use (its cost against a raw event record),
# shim_alloc (the allocation hot path against torch's allocator and the C
# pair) and sanitizer (the sanitizer's cost with CSAN in the same run,
# about 150 s).  Logs under $OUT.
#   tools/gpu_final_bench.sh [BENCH ...]   (default: cross_stream record_use shim_alloc)
set -u
source tools/gpu_prologue.sh
benches=${*:-cross_stream record_use shim_alloc}
for bench in $benches; do case $bench in
  cross_stream) step bench_cross_stream 220 18 python3 benchmarks/bench_cross_stream.py --rounds "${CROSS_ROUNDS:-2}" \
    --pipeline-rounds "${PIPELINE_ROUNDS:-6}" \
    --json "$OUT/cross_stream.json" ;;
  record_use) step bench_record_use 150 30 python3 benchmarks/bench_record_use.py --device cuda --calls 20000 \
    --rounds 9 --json "$OUT/record_use.json" ;;
  shim_alloc) step bench_shim_alloc 110 14 python3 benchmarks/bench_shim_alloc.py --json "$OUT/shim_alloc.json" ;;
  sanitizer) step bench_sanitizer 150 12 python3 benchmarks/bench_sanitizer.py --rounds 3 --steps 200 --repeats 5 ;;
  *) echo "bench: cross_stream, record_use, shim_alloc or sanitizer, not $bench"; exit 2 ;;
esac; done
echo "== total $((SECONDS-T0)) s"
