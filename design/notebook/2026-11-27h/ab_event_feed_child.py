import sys, time, json
sys.path.insert(0, "benchmarks"); sys.path.insert(0, ".")
import torch
torch.set_num_threads(1)
from npu_lifetime.sanitizer import native
variant = sys.argv[1]
if variant == "feed-off":
    native.event_feed = None
from bench_sanitizer import workload, _device
from variants import setup_variant
dev = _device("cuda")
workload(dev, 20)
if variant != "none":
    s = setup_variant("lifetime", "cuda")
workload(dev, 100)
ts = []
for _ in range(9):
    torch.cuda.synchronize(); t = time.perf_counter(); ops = workload(dev, 400); ts.append((time.perf_counter() - t) / ops * 1e6)
ts.sort(); print(json.dumps({"variant": variant, "median": ts[4]}))
