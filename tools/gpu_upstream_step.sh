#!/usr/bin/env bash
# One device call's share of torch's own suites under both allocators
# (tests/upstream/run_suites.py with --resume).  The device machine keeps
# nothing between calls that find it cold, so the run's state
# (OUT/<suite>/<allocator>/results.jsonl) travels: it is seeded from
# SEED/<suite>_<allocator>.jsonl when /tmp/upruns lacks it, and copied back to
# $OUT flat, for the next call to carry as its SEED.
#   tools/gpu_upstream_step.sh SUITE LIMIT_S [SEED]
# Needs the upstream files under .upstream/test and expecttest on PYTHONPATH.
set -u
suite=$1 limit=$2 seed=${3:-}
OUT=${OUT:-/tmp/gpu_out}
runs=/tmp/upruns
mkdir -p "$OUT"
[ -e npu_lifetime/_native/libnpl*.so ] || python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
for a in native shim; do
  if [ -n "$seed" ] && [ -f "$seed/${suite}_$a.jsonl" ] && [ ! -f "$runs/$suite/$a/results.jsonl" ]; then
    mkdir -p "$runs/$suite/$a" && cp "$seed/${suite}_$a.jsonl" "$runs/$suite/$a/results.jsonl"
  fi
done
python3 tests/upstream/run_suites.py .upstream -s "$suite" --timeout "$limit" --test-timeout 120 --resume --no-confirm \
  --out "$runs" > "$OUT/${suite}_console.txt" 2>&1
echo "run_suites rc=$?"
for a in native shim; do cp "$runs/$suite/$a/results.jsonl" "$OUT/${suite}_$a.jsonl" 2>/dev/null; done
cp "$runs/comparison.md" "$OUT/" 2>/dev/null
grep -E "restart|finished|left|passed|failed" "$OUT/${suite}_console.txt" | tail -12
