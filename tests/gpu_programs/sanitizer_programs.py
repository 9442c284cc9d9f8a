"""The sanitizer with the shim installed (a fresh process each)."""
import gc
import json
import sys

import torch

import npu_lifetime
from npu_lifetime import shim
from npu_lifetime.sanitizer import LifetimeSanitizer

from shim_programs import N, SLEEP_CYCLES, warm_up_kernels


def uncovered_free_under_shim():
    """A buggy handoff: the sanitizer reports the free, tells the shim, and
    the shim keeps the block from the next allocation."""
    npu_lifetime.install("cuda")
    warm_up_kernels()
    san = LifetimeSanitizer("cuda", on_race="collect", warn_on_free=False)
    with san:
        side = torch.cuda.Stream()
        x = torch.ones(N, device="cuda")
        x_ptr = x.data_ptr()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.cuda._sleep(SLEEP_CYCLES)
            y = x * 2
        del x
        gc.collect()
        z = torch.empty(N, device="cuda")
        z.fill_(7.0)
        reused = z.data_ptr() == x_ptr
        torch.cuda.synchronize()
        corrupted = not bool((y == 2).all())
    return {"sanitizer": [f.kind for f in san.flush() if not getattr(f, "live", False)],
            "shim": [f["kind"] for f in shim.findings()], "reused": reused, "corrupted": corrupted}


def table_under_shim():
    npu_lifetime.install("cuda")
    out = {}
    for mode in ("record_use", "none", "record_stream"):
        san = LifetimeSanitizer("cuda", on_race="collect", warn_on_free=False)
        with san:
            side = torch.cuda.Stream()
            x = torch.ones(4096, device="cuda")
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                x.sum()
            if mode == "record_use":
                npu_lifetime.record_use(x, side)
            elif mode == "record_stream":
                x.record_stream(side)
            del x
            gc.collect()
        out[mode] = [f.kind for f in san.flush() if not getattr(f, "live", False)]
        torch.cuda.synchronize()
    return out


PROGRAMS = {f.__name__: f for f in (uncovered_free_under_shim, table_under_shim)}

if __name__ == "__main__":
    print(json.dumps(PROGRAMS[sys.argv[1]](*sys.argv[2:])))
