#!/usr/bin/env bash
# Issue 40 on one GPU, in one command that builds everything: the corpus of
# publicly reported bugs on cuda (the sanitizer's verdicts, the data under
# the shim's debug mode with a slow kernel, compute-sanitizer's verdicts),
# then its GPU tests.  Logs under $OUT.
set -u
OUT=${OUT:-/tmp/gpu_out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  git rev-parse HEAD 2>/dev/null; python3 -c "import sys, torch; print('torch', torch.__version__, sys.version.split()[0])"
  compute-sanitizer --version | tail -1; } | tee "$OUT/machine.txt"
T0=$SECONDS; python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build $((SECONDS-T0)) s"
timeout "${CORPUS_LIMIT:-420}" python3 -m npu_lifetime.cli corpus --device cuda --corruption --compute-sanitizer \
  --json "$OUT/corpus_cuda.json" > "$OUT/corpus_cuda.txt" 2> "$OUT/corpus_cuda.err"
echo "corpus rc=$? $((SECONDS-T0)) s"; cat "$OUT/corpus_cuda.txt"; tail -5 "$OUT/corpus_cuda.err"
if [ -n "${TESTS:-}" ]; then
  timeout "${TEST_LIMIT:-300}" python3 -m pytest -q -rfEs -p no:cacheprovider $TESTS > "$OUT/gpu_tests.log" 2>&1
  echo "tests rc=$? $((SECONDS-T0)) s"; grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.log" | head -20; tail -2 "$OUT/gpu_tests.log"
fi
echo "total $((SECONDS-T0)) s"
