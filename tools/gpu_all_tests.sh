#!/usr/bin/env bash
# Every GPU test of the project (tests/**/test_gpu_*.py, *_gpu.py), in one
# command that builds everything: two pytest processes side by side, the
# shim's files in one (they read the device's memory, so they run one at a
# time) and every other component's in the other; then, on the quiet
# machine, the cross-stream benchmark (rounds: $1, default 3).  Logs under $OUT.
#   tools/gpu_all_tests.sh [CROSS_STREAM_ROUNDS] [TEST_LIMIT_S]
set -u
rounds=${1:-3} limit=${2:-400}
source tools/gpu_prologue.sh
gpu_tests() { find tests "$@" \( -name 'test_gpu_*.py' -o -name 'test_*_gpu.py' \) -not -path '*/upstream/*' | sort; }
run_group() { local name=$1; shift
  timeout "$limit" python3 -m pytest -q -rfEs -p no:cacheprovider "$@" > "$OUT/gpu_tests_$name.log" 2>&1
  echo "== GPU tests ($name) rc=$? $((SECONDS-T0)) s"; grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests_$name.log" | head -20
  tail -1 "$OUT/gpu_tests_$name.log"; }
run_group shim $(gpu_tests -path 'tests/shim/*') > "$OUT/group_shim.txt" &
shim=$!
run_group others $(gpu_tests -not -path 'tests/shim/*')
wait $shim; cat "$OUT/group_shim.txt"
t=$SECONDS
timeout 200 python3 benchmarks/bench_cross_stream.py --rounds "$rounds" --json "$OUT/cross_stream.json" \
  > "$OUT/bench_cross_stream.log" 2>&1
echo "== bench_cross_stream rc=$? $((SECONDS-t)) s"; tail -16 "$OUT/bench_cross_stream.log"
echo "== total $((SECONDS-T0)) s"
