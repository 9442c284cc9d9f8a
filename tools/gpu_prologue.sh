# Sourced by the GPU scripts: $OUT, the machine and commit in $OUT/machine.txt,
# the shim and every extension built (the script stops if the build fails).
OUT=${OUT:-/tmp/gpu_out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
T0=$SECONDS
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  git rev-parse HEAD 2>/dev/null; python3 -c "import sys, torch; print('torch', torch.__version__, sys.version.split()[0])"; } \
  | tee "$OUT/machine.txt"
if [ -z "${SKIP_BUILD:-}" ]; then  # SKIP_BUILD=1: an earlier script of the same command built it
  python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
fi
echo "== build $((SECONDS-T0)) s"
# step NAME LIMIT_S LINES CMD...: CMD under a time limit, its output in $OUT/NAME.log, its status,
# time and last LINES lines on the console
step() { local name=$1 limit=$2 lines=$3; shift 3; local t=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; echo "== $name rc=$? $((SECONDS-t)) s"; tail -"$lines" "$OUT/$name.log"; }
