#!/usr/bin/env bash
# The chain benchmark's lifetime+shim child for two builds of the repo,
# interleaved, in one call (the A/B that decides whether a shim change moved
# the sanitizer+shim figure):
#   design/notebook/2026-11-27d/ab_shim_builds.sh DIR_A DIR_B [ROUNDS]
# Each DIR is an export of a commit (git archive); both are built first.
set -u
a=$1 b=$2 rounds=${3:-5}
export PYTHONUNBUFFERED=1
(cd "$a" && python3 setup.py build_ext --inplace > /tmp/ab_a.log 2>&1) &
(cd "$b" && python3 setup.py build_ext --inplace > /tmp/ab_b.log 2>&1) &
wait
for r in $(seq "$rounds"); do
  for d in "$a" "$b"; do
    (cd "$d" && PYTHONPATH="$d" timeout 60 python3 benchmarks/bench_sanitizer.py --child lifetime+shim --device cuda \
      --steps 200 --repeats 5 | tail -1 |
      python3 -c "import json, statistics, sys; d = json.loads(sys.stdin.read()); \
print('$d', round(statistics.median(d['times']) / d['ops'] * 1e6, 2), 'us/op')")
  done
done
