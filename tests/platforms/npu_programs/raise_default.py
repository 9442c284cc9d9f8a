"""The sanitizer's default (on_race="raise") on npu: a read on a side stream
of x, written on the default stream with no wait, must raise DataRaceError.
The op's fresh output is released while that error is pending; its free runs
torch_npu's trace hook into Python (issue 36: it cleared the error, and the
user got SystemError).  Prints one JSON line: what was raised."""
import json

import torch
import torch_npu  # noqa: F401

from npu_lifetime.sanitizer import DataRaceError, LifetimeSanitizer

side = torch.npu.Stream()
raised = None
try:
    with LifetimeSanitizer("npu"):
        x = torch.randn(100, device="npu")
        with torch.npu.stream(side):
            _ = x + 1
except DataRaceError as error:
    raised = ["DataRaceError", len(error.races)]
except Exception as error:  # noqa: BLE001  (what the user would see instead)
    raised = [type(error).__name__, str(error)[:300]]
# an in-place op (its output is an input: nothing is released) raises too
try:
    with LifetimeSanitizer("npu"):
        y = torch.randn(100, device="npu")
        with torch.npu.stream(side):
            y.add_(1)
    in_place = None
except DataRaceError:
    in_place = "DataRaceError"
except Exception as error:  # noqa: BLE001
    in_place = type(error).__name__
print(json.dumps({"raised": raised, "in_place": in_place}))
