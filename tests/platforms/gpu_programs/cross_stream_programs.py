"""Cross-stream reuse on a real GPU, one mode per process: a block freed on
a stream still running, then an allocation of its size on another stream,
then on a third once everything ran.  Prints one JSON line.

    python tests/platforms/gpu_programs/cross_stream_programs.py busy_donor MODE
"""
import json
import sys

import torch

import npu_lifetime
from npu_lifetime import shim

N = (64 << 20) // 4  # 64 MiB of float32: a large segment of its own


def busy_donor(mode: str) -> dict:
    npu_lifetime.install("cuda")
    shim.set_cross_stream_reuse(mode)
    donor, taker, later = torch.cuda.Stream(), torch.cuda.Stream(), torch.cuda.Stream()
    # each kernel's first launch may load it lazily and wait for the device: launch them once first
    torch.cuda._sleep(1)
    torch.empty(16, device="cuda").fill_(1.0)
    torch.cuda.synchronize()
    with torch.cuda.stream(donor):
        x = torch.empty(N, device="cuda")  # first: a new segment's cudaMalloc may wait for the device
        torch.cuda._sleep(200_000_000)  # the donor is busy (about 0.1 s) when the taker allocates
        x.fill_(1.0)  # queued behind the sleep: lands late
        freed = x.data_ptr()
        del x
    with torch.cuda.stream(taker):
        y = torch.empty(N, device="cuda")
        y.fill_(2.0)  # must land after the donor's fill if y took its memory
    busy_take = {"same_address": y.data_ptr() == freed, "moved": shim.stats()["cross_stream_segments"],
                 "waits": shim.stats()["stream_waits"]}
    torch.cuda.synchronize()
    y_ok = bool((y == 2).all().item())
    taken_by_y = busy_take["same_address"]
    del y
    torch.cuda.synchronize()  # every stream idle now
    before = shim.stats()  # (y == 2) above allocated too, on the current stream: counted from here
    with torch.cuda.stream(later):
        z = torch.empty(N, device="cuda")
        z.fill_(3.0)
    idle_take = {"moved": shim.stats()["cross_stream_segments"] - before["cross_stream_segments"],
                 "waits": shim.stats()["stream_waits"] - before["stream_waits"]}
    torch.cuda.synchronize()
    return {"mode": shim.cross_stream_reuse(), "busy_take": busy_take, "y_ok": y_ok, "taken_by_y": taken_by_y,
            "idle_take": idle_take, "z_ok": bool((z == 3).all().item()), "findings": shim.findings()}


PROGRAMS = {f.__name__: f for f in (busy_donor,)}

if __name__ == "__main__":
    print(json.dumps(PROGRAMS[sys.argv[1]](*sys.argv[2:])))
