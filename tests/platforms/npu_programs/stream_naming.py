"""How often the sanitizer hears of NPU streams being made: once per
``torch.npu.Stream()`` call, never for ``current_stream()`` (torch_npu makes
a Stream object wrapping the current stream each time).  Prints a JSON
object."""
import json

import torch
import torch_npu

from npu_lifetime.sanitizer import LifetimeSanitizer

calls = []
san = LifetimeSanitizer("npu", on_race="collect")
# counted by a function whose frame is not the program's ("<counter>"), so
# that the site the sanitizer takes is still the line that made the stream
counter = compile("def counted(key):\n    calls.append(key)\n    heard(key)\n", "<counter>", "exec")
namespace = {"calls": calls, "heard": san.on_stream_constructed}
exec(counter, namespace)
san.on_stream_constructed = namespace["counted"]
with san:
    for _ in range(10):
        torch.npu.current_stream()
    after_current = len(calls)
    side = torch.npu.Stream()
    other = torch.npu.Stream()
    after_two = len(calls)
    launcher = torch_npu.npu.SyncLaunchStream()
    names = [san.names(key) for key in calls[:after_two + 1]]
print(json.dumps({"after_current_stream": after_current, "after_two_streams": after_two, "names": names}))
