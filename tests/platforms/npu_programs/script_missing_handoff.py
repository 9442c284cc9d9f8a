"""A script for `npu-lifetime check --device npu`: x is read on a side stream and dropped with
no hand-off (an uncovered free)."""
import torch
side = torch.npu.Stream()
x = torch.ones(1024, device="npu")
side.wait_stream(torch.npu.current_stream())
with torch.npu.stream(side):
    y = x * 2
del x
torch.npu.synchronize()
print("done", float(y.sum()))
