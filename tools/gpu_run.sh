#!/usr/bin/env bash
# One GPU session: build the shim from this tree, run the given pytest
# files and benchmark commands, keep every log under $OUT (the device tool
# brings it back).  Each step has its own time limit and never stops the
# others.
#   tools/gpu_run.sh "tests/test_gpu_a.py tests/test_gpu_b.py" "benchmarks/bench_x.py --args" ...
set -u
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/machine.txt"
python3 -c "import torch; print('torch', torch.__version__, 'gpus', torch.cuda.device_count())" | tee -a "$OUT/machine.txt"
python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
git rev-parse HEAD 2>/dev/null | tee -a "$OUT/machine.txt"
tests=$1; shift
if [ -n "$tests" ]; then
  timeout "${TEST_LIMIT:-420}" python3 -m pytest -q -rfE -p no:cacheprovider $tests > "$OUT/tests.log" 2>&1
  echo "tests rc=$?"; grep -E "passed|failed" "$OUT/tests.log" | tail -1; grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -30
fi
i=0
for bench in "$@"; do
  i=$((i + 1))
  timeout "${BENCH_LIMIT:-240}" python3 $bench > "$OUT/bench$i.log" 2>&1
  echo "== bench$i rc=$? ($bench)"; tail -${BENCH_TAIL:-14} "$OUT/bench$i.log"
done
