#!/usr/bin/env bash
# The shim's oracle mode on one GPU, in one command that builds everything:
# compute-sanitizer (--track-stream-ordered-races all) checks the shim's own
# reuse decisions.  1) the shim's GPU tests and 2) a real model in the oracle
# mode: 0 errors expected; 3) a hand-off with the real shim: 0 errors, and with
# a shim built to release blocks without waiting (NPL_MUTANT_ORDERED_RELEASE):
# errors expected.  Logs under $OUT.
set -u
OUT=${OUT:-/tmp/gpu_out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
T0=$SECONDS; python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
CS="compute-sanitizer --tool memcheck --track-stream-ordered-races all --target-processes all --print-limit 500"
# errors by kind: memory accesses (use-after-free, use-before-alloc, invalid) apart from API errors
summary() { grep -hE "^========= [A-Z]" "$1" | grep -v "COMPUTE-SANITIZER" | sed 's/ at 0x[0-9a-f]*//; s/ of size [0-9,]* bytes//' \
  | sort | uniq -c; }
# Left out: the tests that assert caching or a policy (the mode caches nothing and uses stream_wait), the
# out-of-memory test, whose failed cudaMallocAsync calls compute-sanitizer reports as API errors, and the
# deliberately buggy hand-off (run alone below: its errors are the program's bug, which must be reported).
NPU_LIFETIME_SHIM_ORACLE=1 timeout "${TEST_LIMIT:-300}" $CS python3 -m pytest -q -p no:cacheprovider \
  ${ORACLE_TESTS:-tests/shim/test_gpu_shim.py tests/recording/test_gpu_record_use.py} \
  -k "not blocks_cached and not poll_policy and not lazy_wait_holds and not out_of_memory and not late_reader_sees" \
  > "$OUT/oracle_tests.log" 2>&1
echo "1) shim GPU tests in the oracle mode rc=$? $((SECONDS-T0)) s: $(tail -1 "$OUT/oracle_tests.log")"; summary "$OUT/oracle_tests.log"
# the GPU tests' own buggy hand-off (no record call), alone: the program's bug must be reported
NPU_LIFETIME_SHIM_ORACLE=1 timeout 60 $CS python3 -m pytest -q -p no:cacheprovider tests/shim/test_gpu_shim.py \
  -k "late_reader_sees_corruption and shim" > "$OUT/oracle_buggy_test.log" 2>&1
echo "1b) the tests' buggy hand-off rc=$?: $(tail -1 "$OUT/oracle_buggy_test.log")"; summary "$OUT/oracle_buggy_test.log"
NPU_LIFETIME_SHIM_ORACLE=1 timeout 90 $CS python3 tools/oracle_programs.py model > "$OUT/oracle_model.log" 2>&1
echo "2) model rc=$? $((SECONDS-T0)) s: $(grep '^{' "$OUT/oracle_model.log")"; summary "$OUT/oracle_model.log"
NPU_LIFETIME_SHIM_ORACLE=1 timeout 60 $CS python3 tools/oracle_programs.py handoff > "$OUT/oracle_handoff.log" 2>&1
echo "3a) hand-off, the shim rc=$?: $(grep '^{' "$OUT/oracle_handoff.log")"; summary "$OUT/oracle_handoff.log"
NPU_LIFETIME_SHIM_ORACLE=1 timeout 60 $CS python3 tools/oracle_programs.py buggy > "$OUT/oracle_buggy.log" 2>&1
echo "3c) the hand-off without record_use (the program's bug) rc=$?: $(grep '^{' "$OUT/oracle_buggy.log")"
summary "$OUT/oracle_buggy.log"
python3 - <<'PY' > "$OUT/mutant_build.log" 2>&1
import sys; sys.path.insert(0, "tests")
from pathlib import Path
from helpers.shim_testing import build_shim
out = Path("/tmp/npl_mutant"); out.mkdir(exist_ok=True)
print(build_shim(out, "-DNPL_MUTANT_ORDERED_RELEASE"))
PY
NPU_LIFETIME_SHIM=/tmp/npl_mutant/libnpl_mutant.so NPU_LIFETIME_SHIM_ORACLE=1 timeout 60 $CS \
  python3 tools/oracle_programs.py handoff > "$OUT/oracle_mutant.log" 2>&1
echo "3b) hand-off, a shim releasing without waiting rc=$?: $(grep '^{' "$OUT/oracle_mutant.log")"
summary "$OUT/oracle_mutant.log"
echo "total $((SECONDS-T0)) s"
