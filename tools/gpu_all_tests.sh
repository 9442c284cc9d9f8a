#!/usr/bin/env bash
# The project's GPU tests (tests/**/test_gpu_*.py, *_gpu.py) of one group,
# in one command that builds everything, one test at a time: "shim" (the
# shim's files: they read and fill the device's memory, so nothing may run
# beside them) or "others" (every other component's), each with the GPU to
# itself.  Log under $OUT.
#   tools/gpu_all_tests.sh shim|others [LIMIT_S]
set -u
group=${1:?shim or others} limit=${2:-400}
source tools/gpu_prologue.sh
gpu_tests() { find tests "$@" \( -name 'test_gpu_*.py' -o -name 'test_*_gpu.py' \) -not -path '*/upstream/*' | sort; }
case $group in
  shim) files=$(gpu_tests -path 'tests/shim/*') ;;
  others) files=$(gpu_tests -not -path 'tests/shim/*') ;;
  *) echo "group: shim or others, not $group"; exit 2 ;;
esac
# -v: each test's name as it ends; --timeout (pytest-timeout, on the GPU machine): a test that hangs fails
# with its stack instead of taking the group's time; the corpus's children keep their output
NPU_LIFETIME_TEST_LOGS="$OUT/children" step "gpu_tests_$group" "$limit" 25 python3 -m pytest -v -rfEs \
  -p no:cacheprovider --timeout="${TEST_TIMEOUT_S:-240}" --durations=12 $files
echo "== total $((SECONDS-T0)) s"
