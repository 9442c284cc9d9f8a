"""A script for `npu-lifetime check --device npu`: x, written on the default stream, is read on a
side stream that never waited for it (a data race)."""
import torch
side = torch.npu.Stream()
x = torch.ones(1024, device="npu")
with torch.npu.stream(side):
    y = x * 2
torch.npu.synchronize()
print("done", float(y.sum()))
