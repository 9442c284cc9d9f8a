#!/usr/bin/env bash
# Issue 39 item 3 on one GPU, in one command that builds everything:
# record_use's cost (raw event record, the C entry and Tensor.record_use
# under the shim, bare npl_record_use, the Python reference entry, the
# fallback for one storage and for a new storage each call; medians of
# interleaved rounds, ratios, the targets), then the record_use GPU tests
# (the C entry against its reference on CUDA).  Logs under $OUT.
set -u
OUT=${OUT:-/tmp/gpu_out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
T0=$SECONDS
git rev-parse HEAD 2>/dev/null > "$OUT/commit.txt"
python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
python3 -c "from npu_lifetime.recording import calls; assert calls._entry is not None, 'the C entry was not built'" \
  || { grep -n "_entry" "$OUT/build.log" | tail; exit 1; }
echo "== build $((SECONDS-T0)) s"
for run in 1 2; do  # twice: a difference smaller than between the two runs is noise
  timeout 240 python3 benchmarks/bench_record_use.py --device cuda --calls 20000 --rounds 7 \
    --json "$OUT/record_use_$run.json" > "$OUT/record_use_$run.txt" 2>&1
  echo "== bench_record_use run $run rc=$? $((SECONDS-T0)) s"; cat "$OUT/record_use_$run.txt"
done
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/recording/test_record_use_entry_gpu.py tests/recording/test_gpu_record_use.py \
  > "$OUT/record_use_tests.log" 2>&1
echo "== record_use GPU tests rc=$? $((SECONDS-T0)) s: $(tail -1 "$OUT/record_use_tests.log")"
grep -E "^(FAILED|ERROR)" "$OUT/record_use_tests.log" | head
echo "== total $((SECONDS-T0)) s"
