#!/usr/bin/env bash
# Issue 18's three benchmarks in one command that builds everything: the
# 3-stream chain (with the empty-mode floor), the MLP training loop and the
# transformer training step, each with CSAN in the same run, variants in
# alternating fresh processes.  Logs under $OUT; each benchmark has its own
# time limit and never stops the others.
#   tools/gpu_bench_sanitizer.sh            (CHAIN_ROUNDS, TRAIN_ROUNDS to change the rounds; RSS_OPS for the RSS loop;
#                                            TORCH_TRACE=1: the chain also without the GPU trace bridge, a sixth
#                                            variant: with 7 rounds the whole run then passed 600 s on a slow host)
set -u
OUT=${OUT:-/tmp/gpu_out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  cat COMMIT 2>/dev/null || git rev-parse HEAD
  python3 -c "import torch; print('torch', torch.__version__)"; } > "$OUT/machine.txt"
T0=$SECONDS; python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
# the GPU trace bridge, built against this torch before any timing (it is cached)
python3 -c "from npu_lifetime.shim import bridge; print('trace bridge:', bridge.build(name=bridge.GPU_TRACE_BRIDGE))" \
  >> "$OUT/machine.txt" 2>&1
python3 -c "import npu_lifetime.sanitizer.native as n; print('native parts in use:', n.in_use())" >> "$OUT/machine.txt"
echo "build $((SECONDS-T0)) s"; cat "$OUT/machine.txt"
bench() { local name=$1 limit=$2; shift 2; local t=$SECONDS
  timeout "$limit" python3 "$@" > "$OUT/$name.log" 2>&1; echo "== $name rc=$? $((SECONDS-t)) s"; tail -"${TAILN:-9}" "$OUT/$name.log"; }
R=${CHAIN_ROUNDS:-5}; TR=${TRAIN_ROUNDS:-2}
PER_ROUND=$((${TORCH_TRACE:+10 +} 45))  # seconds a chain round may take
TAILN=14 bench bench_sanitizer $((PER_ROUND * R + 30)) benchmarks/bench_sanitizer.py --rounds "$R" --steps 200 --repeats 5 --floor ${TORCH_TRACE:+--torch-trace}
bench bench_training_mlp $((60 * TR + 40)) benchmarks/bench_training.py --rounds "$TR" --steps 10 --repeats 3
bench bench_training_transformer $((50 * TR + 40)) benchmarks/bench_training.py --model transformer --rounds "$TR" --steps 5 --repeats 3
# RSS_OPS=N: then the sanitizer's RSS over an N-op loop (Done-when: flat over 1M ops)
if [ -n "${RSS_OPS:-}" ]; then bench bench_rss 240 benchmarks/bench_rss.py --device cuda --ops "$RSS_OPS"; fi
