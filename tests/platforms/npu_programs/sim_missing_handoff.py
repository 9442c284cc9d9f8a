"""A script for `npu-lifetime check --device sim` in the NPU environment: the
simulated device's forgotten hand-off (needs no torch_npu)."""
import torch
from npu_lifetime import simdevice as sd

side = sd.Stream()
x = torch.ones(1024)
side.wait_stream(sd.default_stream())
with sd.stream(side):
    y = x * 2
del x
