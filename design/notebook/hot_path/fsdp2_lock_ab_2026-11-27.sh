#!/bin/bash
# A/B of the allocator lock on FSDP2 (2 GPUs), run from the repository root:
#   lock  = this tree built with -DNPL_FUTEX_LOCK (allocator_lock.h: the futex mutex that never spins)
#   mutex = this tree as installed (std::mutex, the default)
# interleaved, three times; prints record_use/recipe step time per rank (as fsdp2_lock_ab_run.sh).
set -u
OUT=${OUT:-/tmp/ab_out}; mkdir -p $OUT
export PYTHONPATH=$PWD PYTHONWARNINGS=ignore NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
python3 setup.py build_ext --inplace > $OUT/build.log 2>&1 || { tail $OUT/build.log; exit 1; }
FLAGS="-std=c++17 -O2 -fPIC -shared -fvisibility=hidden -Wall -Wextra -Werror -DNPL_FUTEX_LOCK"
g++ $FLAGS -Iallocator_shim/include allocator_shim/src/*.cpp -o /tmp/lib_futex.so -ldl -lpthread || exit 1
MUTEX=$(ls $PWD/npu_lifetime/_native/libnpl*.so)
for i in 1 2 3; do
  for v in lock mutex; do
    lib=/tmp/lib_futex.so; [ $v = mutex ] && lib=$MUTEX
    d=$OUT/$v$i; mkdir -p $d
    NPU_LIFETIME_SHIM=$lib timeout 200 python3 -m torch.distributed.run --nproc_per_node=2 examples/fsdp2_record_use.py \
        --device cuda --allocator shim --phases timing --json $d > $d/log 2>&1
    python3 - $d $v <<'PY'
import json, sys
d, v = sys.argv[1], sys.argv[2]
for r in (0, 1):
    t = json.load(open(f"{d}/rank{r}.json"))["timing"]
    a, b = t["recipe"]["step_ms_median"], t["record_use"]["step_ms_median"]
    print(f"{v:>6} rank{r}: recipe {a:.2f} ms, record_use {b:.2f} ms, ratio {b / a:.3f}")
PY
  done
done
