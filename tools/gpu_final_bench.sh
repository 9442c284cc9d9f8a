#!/usr/bin/env bash
# Issues 37, 39 and 41's GPU figures, call 2 of 2, in one command that
# builds everything, on a quiet machine: cross-stream reuse against torch's
# allocator and cudaMallocAsync, record_use's cost against a raw event
# record, the allocation hot path against torch's allocator, and (with
# WITH_SANITIZER=1) the sanitizer's cost with CSAN in the same run.  Logs under $OUT.
set -u
source tools/gpu_prologue.sh
[ -n "${SKIP_CROSS_STREAM:-}" ] ||  # (SKIP_CROSS_STREAM=1: tools/gpu_all_tests.sh ran it)
  step bench_cross_stream 170 16 python3 benchmarks/bench_cross_stream.py --rounds 3 --json "$OUT/cross_stream.json"
step bench_record_use 130 30 python3 benchmarks/bench_record_use.py --device cuda --calls 20000 --rounds 7 \
  --json "$OUT/record_use.json"
step bench_shim_alloc 110 14 python3 benchmarks/bench_shim_alloc.py --json "$OUT/shim_alloc.json"
[ -z "${WITH_SANITIZER:-}" ] ||  # the sanitizer's cost against CSAN (WITH_SANITIZER=1: about 150 s more)
  step bench_sanitizer 150 12 python3 benchmarks/bench_sanitizer.py --rounds 3 --steps 200 --repeats 5
echo "== total $((SECONDS-T0)) s"
