"""The sanitizer with the shim installed (a fresh process each)."""
import gc
import json
import sys

import torch

import npu_lifetime
from npu_lifetime import shim
from npu_lifetime.sanitizer import LifetimeSanitizer

from shim_programs import N, SLEEP_CYCLES, warm_up_kernels


def _doubled_on_side_then_dropped():
    """x doubled on a side stream behind a sleep (so the read is still queued)
    and dropped with no hand-off: the side stream, the result, x's address."""
    side = torch.cuda.Stream()
    x = torch.ones(N, device="cuda")
    x_ptr = x.data_ptr()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP_CYCLES)
        y = x * 2
    del x
    return side, y, x_ptr


def uncovered_free_under_shim():
    """A buggy handoff: the sanitizer reports the free, tells the shim, and
    the shim keeps the block from the next allocation."""
    npu_lifetime.install("cuda")
    warm_up_kernels()
    san = LifetimeSanitizer("cuda", on_race="collect", warn_on_free=False)
    with san:
        side, y, x_ptr = _doubled_on_side_then_dropped()
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


def warnings_as_errors_under_shim():
    """Two uncovered uses at one free under ``-W error``: the sanitizer keeps
    both findings and tells the shim of both, so the block is deferred."""
    import warnings

    npu_lifetime.install("cuda")
    warm_up_kernels()
    warnings.simplefilter("error")
    san = LifetimeSanitizer("cuda", on_race="collect", warn_on_free=True)
    with san:
        sides = [torch.cuda.Stream(), torch.cuda.Stream()]
        x = torch.ones(N, device="cuda")
        x_ptr = x.data_ptr()
        for side in sides:
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                torch.cuda._sleep(SLEEP_CYCLES)
                x.sum()
        del x
        gc.collect()
        z = torch.empty(N, device="cuda")
        reused = z.data_ptr() == x_ptr
        torch.cuda.synchronize()
    found = [f for f in san.flush() if not getattr(f, "live", False)]
    return {"sanitizer": sorted(f.kind for f in found), "shim": sorted(f["kind"] for f in shim.findings()),
            "reused": reused}


def reuse_race_native_allocator():
    """The caching allocator hands a freed block straight back on its stream:
    the new owner's write is not ordered after the uncovered read."""
    warm_up_kernels()
    san = LifetimeSanitizer("cuda", on_race="collect", warn_on_free=False)
    with san:
        side, y, x_ptr = _doubled_on_side_then_dropped()
        z = torch.empty(N, device="cuda")
        reused = z.data_ptr() == x_ptr
        z.fill_(7.0)
        torch.cuda.synchronize()
        corrupted = not bool((y == 2).all())
    found = [f for f in san.flush() if not getattr(f, "live", False)]
    return {"kinds": sorted(f.kind for f in found), "failing": sorted(f.kind for f in san.failing(found)),
            "reused": reused, "corrupted": corrupted}


PROGRAMS = {f.__name__: f for f in (uncovered_free_under_shim, table_under_shim, warnings_as_errors_under_shim,
                                    reuse_race_native_allocator)}

if __name__ == "__main__":
    print(json.dumps(PROGRAMS[sys.argv[1]](*sys.argv[2:])))
