#!/usr/bin/env bash
# The 2-GPU suite (issue 20) and the FSDP2 benchmark at the exported commit, one command that builds the shim
set -u
OUT=${OUT:-/tmp/gpu_out}; mkdir -p $OUT
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; cat COMMIT; python3 -c "import torch; print('torch', torch.__version__, 'gpus', torch.cuda.device_count())"; } > $OUT/machine.txt
T0=$SECONDS; python3 setup.py build_ext --inplace > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "build $((SECONDS-T0)) s"; cat $OUT/machine.txt
step() { local name=$1 limit=$2; shift 2; T=$SECONDS; timeout $limit "$@" > $OUT/$name.log 2>&1; echo "== $name rc=$? $((SECONDS-T)) s"; tail -${TAILN:-6} $OUT/$name.log; }
TAILN=30 step tests2gpu ${TEST_LIMIT:-260} python3 -m pytest -s -rfEs -p no:cacheprovider \
  tests/recording/test_gpu_fsdp2.py "tests/corpus/test_gpu_corpus.py::test_distributed_programs_on_two_gpus" \
  "tests/sanitizer/test_gpu_sanitizer.py::test_a_cross_device_copy_runs_on_the_source_devices_stream" \
  "tests/sanitizer/test_gpu_sanitizer.py::test_nccl_collectives_are_accesses_on_nccls_stream_ordered_by_wait" \
  "tests/sanitizer/test_gpu_sanitizer.py::test_record_use_rejects_bad_input"
grep -E "^(PASSED|FAILED|ERROR|SKIPPED)|passed|failed" $OUT/tests2gpu.log | tail -5
TAILN=12 step bench_fsdp2 ${BENCH_LIMIT:-200} python3 benchmarks/bench_fsdp2.py --device cuda --launches 2 --rounds 4 --steps 20
TAILN=30 step handoff_fsdp2 ${HANDOFF_LIMIT:-100} python3 -c "import sys; from npu_lifetime.cli import main; sys.exit(main())" handoff --device cuda --fsdp2 yes
# the allocator lock's A/B on FSDP2 (design/allocator-shim.md): futex lock vs std::mutex, interleaved
[ "${LOCK_AB:-1}" = 1 ] && TAILN=14 step fsdp2_lock_ab ${AB_LIMIT:-200} env OUT=$OUT/ab bash design/notebook/hot_path/fsdp2_lock_ab_2026-11-27.sh
