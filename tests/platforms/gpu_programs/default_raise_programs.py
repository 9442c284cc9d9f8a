"""Issue 36's programs on CUDA, each in a fresh process: the default raise
(item 1), with torch's allocator or the shim; a race and an uncovered free
made inside a worker thread (item 2).  Prints one JSON line.
   default_raise_programs.py raise [shim]
   default_raise_programs.py thread"""
import gc
import json
import sys
import threading

import torch

import npu_lifetime
from npu_lifetime.sanitizer import DataRaceError, LifetimeSanitizer


def default_raise(shim: bool) -> dict:
    if shim:
        npu_lifetime.install("cuda")
    side = torch.cuda.Stream()
    result = {}
    for name, body in (("fresh_output", lambda x: x + 1), ("in_place", lambda x: x.add_(1))):
        try:
            with LifetimeSanitizer("cuda"):
                x = torch.randn(100, device="cuda")
                with torch.cuda.stream(side):
                    body(x)
            result[name] = None
        except DataRaceError as error:
            result[name] = ["DataRaceError", len(error.races)]
        except Exception as error:  # noqa: BLE001  (what the user would see instead)
            result[name] = [type(error).__name__, str(error)[:300]]
        torch.cuda.synchronize()
    return result


def worker_thread() -> dict:
    def body():
        side = torch.cuda.Stream()
        x = torch.ones(1 << 16, device="cuda")
        with torch.cuda.stream(side):
            y = x * 2  # reads x on side with no wait: a race; x freed with that use uncovered
        del x
        gc.collect()
        torch.cuda.synchronize()
        return y

    san = LifetimeSanitizer("cuda", on_race="collect", warn_on_free=False)
    with san:
        thread = threading.Thread(target=body)
        thread.start()
        thread.join()
    return {"kinds": sorted({f.kind for f in san.flush()})}


if __name__ == "__main__":
    if sys.argv[1] == "raise":
        print(json.dumps(default_raise(shim=len(sys.argv) > 2 and sys.argv[2] == "shim")))
    else:
        print(json.dumps(worker_thread()))
