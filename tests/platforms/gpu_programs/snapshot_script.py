"""A user script for `npu-lifetime snapshot --device cuda` (test_gpu_snapshot):
a tensor read on a side stream, covered by record_use, then by
record_stream, then freed; a later allocation of the same size."""
import torch

import npu_lifetime

side = torch.cuda.Stream()
x = torch.ones(1 << 20, device="cuda")  # 4 MiB
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    y = x * 2
npu_lifetime.record_use(x, side)
w = torch.ones(1 << 20, device="cuda")
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    v = w + 1
w.record_stream(side)
del x, w
torch.cuda.synchronize()
z = torch.empty(1 << 20, device="cuda")
print("done")
