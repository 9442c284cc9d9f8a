#!/usr/bin/env bash
# Issue 37's side-by-side suite in one command that builds the shim: every row
# of design/allocator-shim.md's entry-point table run under torch's allocator
# and under the shim (tests/shim/test_gpu_side_by_side.py), each allocator's raw
# answers kept as JSON (tests/platforms/gpu_programs/side_by_side_programs.py, to
# diagnose a row from the output alone), the memory-history test that failed
# on the H200 with its program's traceback, and the allocation hot path
# against torch's allocator (benchmarks/bench_shim_alloc.py --json).  Logs
# under $OUT.
set -u
OUT=${OUT:-/tmp/gpu_out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
T0=$SECONDS
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())" | tee "$OUT/machine37s.txt"
python3 setup.py build_ext --inplace > "$OUT/build37s.log" 2>&1 || { tail -30 "$OUT/build37s.log"; exit 1; }
for allocator in native shim; do
  timeout 600 python3 tests/platforms/gpu_programs/side_by_side_programs.py $allocator > "$OUT/side_by_side_$allocator.json" \
    2> "$OUT/side_by_side_$allocator.err"
  rc=$?; echo "== side_by_side_programs $allocator rc=$rc $((SECONDS-T0)) s"; tail -c 600 "$OUT/side_by_side_$allocator.err"
  # a run that did not end well is not read back as answers (the test then runs it itself and shows why)
  [ $rc = 0 ] || mv "$OUT/side_by_side_$allocator.json" "$OUT/side_by_side_$allocator.failed.json"
done
ok=1; for allocator in native shim; do [ -s "$OUT/side_by_side_$allocator.json" ] || ok=0; done
[ $ok = 1 ] && export NPL_SIDE_BY_SIDE_ANSWERS=$OUT  # the test reads these answers (else it runs them itself)
timeout "${TEST_LIMIT:-900}" python3 -m pytest -q -rfEsx -p no:cacheprovider tests/shim/test_gpu_side_by_side.py \
  "tests/shim/test_gpu_entry_points.py::test_memory_history_entries_match_torchs_one_for_one" --runxfail \
  > "$OUT/gpu_side_by_side.log" 2>&1
echo "== tests rc=$? $((SECONDS-T0)) s"; grep -E "^(FAILED|ERROR|SKIPPED)" "$OUT/gpu_side_by_side.log" | head -30
tail -2 "$OUT/gpu_side_by_side.log"
timeout 300 python3 benchmarks/bench_shim_alloc.py --json "$OUT/bench_shim_alloc.json" > "$OUT/bench_shim_alloc.log" 2>&1
echo "== bench_shim_alloc rc=$? $((SECONDS-T0)) s"; tail -14 "$OUT/bench_shim_alloc.log"
