#!/usr/bin/env bash
# Where the sanitizer benchmark's chain spends its CPU time, per variant, on
# a machine with no perf (the GPU host): benchmarks/profile/sampler.c
# preloaded into each benchmark child, sampling its timed runs only; then
# each profile symbolized (on this machine: addr2line needs its libraries)
# and split by library.  Raw stacks, profiles and the split go to $OUT.
#   tools/gpu_profile_chain.sh [VARIANT ...]   (default: none lifetime lifetime+shim)
# The preload goes after `timeout`/`env` so the sampled process is the child.
set -u
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
[ -e npu_lifetime/_native/libnpl*.so ] || python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1 \
  || { tail -30 "$OUT/build.log"; exit 1; }
cc -O2 -shared -fPIC -Wall -Wextra -Werror benchmarks/profile/sampler.c -o /tmp/npl_sampler.so || exit 1
variants=${*:-none lifetime lifetime+shim}
stacks=()
for variant in $variants; do
  name=${variant//+/_}
  timeout "${CHILD_LIMIT:-120}" env SAMPLER_MANUAL=1 SAMPLER_US="${SAMPLER_US:-100}" \
    SAMPLER_OUT="$OUT/stacks_$name.txt" LD_PRELOAD=/tmp/npl_sampler.so \
    python3 benchmarks/bench_sanitizer.py --child "$variant" ${DEVICE:+--device $DEVICE} \
    --steps "${STEPS:-400}" --repeats "${REPEATS:-25}" > "$OUT/child_$name.json" 2> "$OUT/child_$name.err"
  echo "== $variant rc=$? $(tail -1 "$OUT/child_$name.err")"
  [ -s "$OUT/stacks_$name.txt" ] || continue
  python3 benchmarks/profile/symbolize.py "$OUT/stacks_$name.txt" --top 90 > "$OUT/profile_$name.txt"
  stacks+=("$OUT/stacks_$name.txt")
done
[ ${#stacks[@]} -gt 0 ] && python3 benchmarks/profile/breakdown.py "${stacks[@]}" | tee "$OUT/breakdown.txt"
