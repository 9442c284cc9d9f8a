"""A script for `npu-lifetime check --device cuda`: x is read on a side stream and dropped with
no hand-off (an uncovered free)."""
import torch
side = torch.cuda.Stream()
x = torch.ones(1024, device="cuda")
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    y = x * 2
del x
torch.cuda.synchronize()
print("done", float(y.sum()))
