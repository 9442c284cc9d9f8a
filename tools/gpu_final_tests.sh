#!/usr/bin/env bash
# Issues 37, 39 and 41's GPU checks, call 1 of 2, in one command that builds
# everything: torch's own suites under both allocators (tools/gpu_suites.sh,
# in the background: correctness only, so they may share the GPU) while the
# GPU tests of this session's work run in the foreground.  Timing is call 2's
# (tools/gpu_final_bench.sh), on a quiet machine.  Logs under $OUT.
#   tools/gpu_final_tests.sh [SUITE_LIMIT_S] [TEST_LIMIT_S]
set -u
suite_limit=${1:-430} test_limit=${2:-420}
source tools/gpu_prologue.sh
SKIP_BUILD=1 OUT="$OUT/suites" bash tools/gpu_suites.sh "$suite_limit" > "$OUT/suites.txt" 2>&1 &
suites=$!
find_tests() { for name in "$@"; do find tests -name "$name" -not -path "*/upstream/*"; done | sort -u; }
tests=$(find_tests 'test_gpu_side_by_side*.py' test_gpu_cross_stream.py test_gpu_record_use.py test_record_use_entry_gpu.py \
  test_gpu_shim.py test_gpu_sanitizer_default_raise.py)
tests="$tests $(find_tests test_gpu_entry_points.py)::test_memory_history_entries_match_torchs_one_for_one"
tests="$tests $(find_tests test_gpu_entry_points.py)::test_cache_info_follows_torchs_rule"
timeout "$test_limit" python3 -m pytest -q -rfEs -p no:cacheprovider $tests > "$OUT/gpu_tests.log" 2>&1
echo "== GPU tests rc=$? $((SECONDS-T0)) s"; grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.log" | head -20; tail -1 "$OUT/gpu_tests.log"
wait $suites
echo "== suites $((SECONDS-T0)) s"; cat "$OUT/suites.txt"
