"""A script for `npu-lifetime check/snapshot --device npu`: the same hand-off, made with record_use."""
import torch
import npu_lifetime
side = torch.npu.Stream()
x = torch.ones(1024, device="npu")
side.wait_stream(torch.npu.current_stream())
with torch.npu.stream(side):
    y = x * 2
npu_lifetime.record_use(x, side)
del x
torch.npu.current_stream().wait_stream(side)
print("done", float(y.sum()))
