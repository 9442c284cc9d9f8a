#!/usr/bin/env bash
# Issues 40 and 39 on one GPU, in one command that builds everything: the
# corpus of public bugs (verdicts, the data under the debug shim,
# compute-sanitizer), the capture-memory benchmark, the cross-stream
# benchmark, the capture-reuse GPU tests, and the shim's oracle mode
# (tools/gpu_oracle.sh).  Logs under $OUT.
set -u
OUT=${OUT:-/tmp/gpu_out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
T0=$SECONDS
git rev-parse HEAD 2>/dev/null > "$OUT/commit.txt"
python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "== build $((SECONDS-T0)) s"
timeout 150 python3 -m npu_lifetime.cli corpus --device cuda --corruption --compute-sanitizer \
  --json "$OUT/corpus_cuda.json" > "$OUT/corpus_cuda.txt" 2> "$OUT/corpus_cuda.err"
echo "== corpus rc=$? $((SECONDS-T0)) s"; grep -E "^[a-z_0-9]+  \[|-> as expected|-> agrees|cases:" "$OUT/corpus_cuda.txt"
timeout 90 python3 benchmarks/bench_capture_memory.py --json "$OUT/capture_memory.json" > "$OUT/capture_memory.txt" 2>&1
echo "== capture memory rc=$? $((SECONDS-T0)) s"; grep -v "^done" "$OUT/capture_memory.txt"
timeout 100 python3 benchmarks/bench_cross_stream.py --json "$OUT/cross_stream.json" > "$OUT/cross_stream.txt" 2>&1
echo "== cross stream rc=$? $((SECONDS-T0)) s"; cat "$OUT/cross_stream.txt" | tail -14
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/shim/test_gpu_capture_reuse.py > "$OUT/capture_tests.log" 2>&1
echo "== capture reuse GPU tests rc=$? $((SECONDS-T0)) s: $(tail -1 "$OUT/capture_tests.log")"
ORACLE_TESTS=tests/shim/test_gpu_shim.py TEST_LIMIT=130 OUT="$OUT" bash tools/gpu_oracle.sh
echo "== oracle done $((SECONDS-T0)) s"
# issue 37's GPU tests merged this session: checkpoints, memory history one for one, cacheInfo
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/shim/test_gpu_entry_points.py \
  -k "checkpoint or history or cache_info" > "$OUT/entry_point_tests.log" 2>&1
echo "== entry-point GPU tests rc=$? $((SECONDS-T0)) s: $(tail -1 "$OUT/entry_point_tests.log")"
grep -E "^(FAILED|ERROR)" "$OUT/entry_point_tests.log" | head
echo "== total $((SECONDS-T0)) s"
