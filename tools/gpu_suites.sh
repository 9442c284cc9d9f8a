#!/usr/bin/env bash
# torch's own suites (test_cuda.py's allocator parts, test_cudagraph_trees.py)
# under torch's allocator and under the shim, in one command that builds
# the shim: both suites at once (four pytest loops on one GPU; a difference
# is then confirmed alone only where time is left), each suite's two
# allocators side by side.  Extra environment for the shim's runs
# (e.g. NPU_LIFETIME_CROSS_STREAM_REUSE=1) is simply exported by the caller.
#   tools/gpu_suites.sh [LIMIT_S]
# Needs the upstream files under .gl/upstream/test (tests/upstream/SOURCES.txt)
# and expecttest on PYTHONPATH (its wheel under .gl/wheels, carried).
set -u
limit=${1:-480}
OUT=${OUT:-/tmp/gpu_out}; mkdir -p "$OUT"
T0=$SECONDS
export PYTHONPATH=$PWD:$(ls $PWD/.gl/wheels/*.whl 2>/dev/null | tr '\n' ':') PYTHONUNBUFFERED=1
git rev-parse HEAD 2>/dev/null > "$OUT/commit.txt"
if [ -z "${SKIP_BUILD:-}" ]; then  # SKIP_BUILD=1: the caller built it (and may be running tests on it)
  python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
fi
echo "== build $((SECONDS-T0)) s; shim's cross-stream reuse: ${NPU_LIFETIME_CROSS_STREAM_REUSE:-idle (the default)}"
for suite in test_cuda test_cudagraph_trees; do
  python3 tests/upstream/run_suites.py .gl/upstream -s $suite --timeout "$limit" --test-timeout 120 --no-confirm \
    --out "$OUT/$suite" > "$OUT/${suite}_console.txt" 2>&1 &
done
wait
echo "== suites done $((SECONDS-T0)) s"
for suite in test_cuda test_cudagraph_trees; do
  echo "== $suite"; sed -n '/^| allocator/,/^$/p' "$OUT/$suite/comparison.md"; grep -E "same pass set|^- \`" "$OUT/$suite/comparison.md" | head -20
done
