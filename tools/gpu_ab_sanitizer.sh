#!/usr/bin/env bash
# A/B of bench_sanitizer between two exports on one device machine: both
# built, then the benchmark alternating A, B, A, B (same machine, same call:
# the machines' speed moves between days and calls).
#   tools/gpu_ab_sanitizer.sh DIR_A DIR_B   (each a `git archive` export; logs under $OUT)
set -u
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
for d in "$1" "$2"; do
  (cd "$d" && python3 setup.py build_ext --inplace > "$OUT/build_$(basename "$d").log" 2>&1; echo "$d build rc=$?"
   PYTHONPATH=$PWD python3 -c "from npu_lifetime.sanitizer import native; print('$d', native.in_use())")
done
for i in 1 2; do for d in "$1" "$2"; do
  (cd "$d" && PYTHONPATH=$PWD timeout 120 python3 benchmarks/bench_sanitizer.py --rounds 2 --steps 200 --repeats 3 \
     > "$OUT/ab_$(basename "$d")_$i.log" 2>&1
   echo "== $d run $i"; grep -E "^(none|csan|lifetime)" "$OUT/ab_$(basename "$d")_$i.log")
done; done
