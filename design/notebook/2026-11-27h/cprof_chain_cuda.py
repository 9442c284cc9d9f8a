"""Which Python functions run per op of the sanitizer benchmark's chain on
CUDA, per variant (cProfile over one workload run; call counts are exact,
times inflated by the profiler).  Run from a checkout with the extensions
built:  PYTHONPATH=. python3 cprof_chain_cuda.py VARIANT STEPS"""
import cProfile
import pstats
import sys
import time

sys.path.insert(0, "benchmarks")
sys.path.insert(0, ".")
import torch  # noqa: E402

torch.set_num_threads(1)
from bench_sanitizer import _device, workload  # noqa: E402
from variants import install_allocator, setup_variant  # noqa: E402

variant = sys.argv[1]
install_allocator(variant)
dev = _device("cuda")
workload(dev, 20)
setup_variant(variant, "cuda")
workload(dev, 200)
n = int(sys.argv[2])
t = time.perf_counter()
ops = workload(dev, n)
print(f"== {variant}: {(time.perf_counter() - t) / ops * 1e6:.2f} us/op unprofiled")
profile = cProfile.Profile()
profile.enable()
ops = workload(dev, n)
profile.disable()
rows = sorted(pstats.Stats(profile).stats.items(), key=lambda kv: -kv[1][1])
for (path, line, name), (_, calls, own, _, _) in rows[:45]:
    print(f"{calls / ops:6.2f}/op  own {own / ops * 1e6:6.2f}us  {path.split('/')[-1]}:{line} {name}")
