"""Fault injection at the sanitizer's C-Python seam on npu (issue 36, item
1), under the real torch_npu over the stand-in CANN runtime, whose trace
hook calls into Python at every allocation and free: in turn, each callable
below raises; what the program saw (raised, or reported as unraisable) is
printed as one JSON line {fault: [type names]}.  A fault inside a device
trace callback (an allocation, free, event or synchronisation) is caught
and logged by torch's trace ("Exception in callback npu_lifetime_..."), as
torch does for every trace subscriber; the program goes on."""
import gc
import json
import sys

import torch
import torch_npu  # noqa: F401

from npu_lifetime.sanitizer import LifetimeSanitizer, native
from npu_lifetime.sanitizer.backends import NpuBackend


class Boom(Exception):
    pass


def body():
    side = torch.npu.Stream()
    x = torch.ones(256, device="npu")
    done = torch.npu.Event()
    done.record()
    side.wait_event(done)
    with torch.npu.stream(side):
        y = x * 2
    side.synchronize()
    del x, y
    gc.collect()
    a = torch.ones(64, device="npu")
    with torch.npu.stream(side):
        _ = a + 1  # a race: the default raise's path
    torch.npu.synchronize()


class Faulty:
    def __init__(self, real, name, hits):
        self._real, self._name, self._hits = real, name, hits

    def __getattr__(self, attr):
        if attr == self._name:
            return raising(attr, self._hits)
        return getattr(self._real, attr)


def raising(name, hits):
    def boom(*args, **kwargs):
        hits.append(name)
        raise Boom(name)

    return boom


def run(make):
    seen, hits = [], []
    old = sys.unraisablehook
    sys.unraisablehook = lambda u: seen.append(type(u.exc_value).__name__)
    try:
        san = make(hits)
        with san:
            body()
    except BaseException as error:  # noqa: BLE001
        seen.append(type(error).__name__)
    finally:
        gc.collect()
        torch.npu.synchronize()
        sys.unraisablehook = old
    return seen if hits else ["(fault not reached)"]


def model_fault(name):
    parts = native.default()

    def make(hits):
        faulty = parts.replace(model=lambda *a, **k: Faulty(parts.model(*a, **k), name, hits))
        return LifetimeSanitizer("npu", warn_on_free=False, parts=faulty)

    return make


def method_fault(name):
    return lambda hits: type("Faulty", (LifetimeSanitizer,), {name: raising(name, hits)})("npu", warn_on_free=False)


results = {"none": run(lambda hits: (hits.append("none"), LifetimeSanitizer("npu", warn_on_free=False))[1])}
for name in ("allocate", "access", "free", "record_event", "wait_event", "synchronize_stream"):
    results[f"model.{name}"] = run(model_fault(name))
for name in ("_stream", "_announce_races"):
    results[f"sanitizer.{name}"] = run(method_fault(name))
original = NpuBackend.current_stream
NpuBackend.current_stream = lambda self, device: (_ for _ in ()).throw(Boom("current_stream"))
results["backend.current_stream"] = run(lambda hits: (hits.append("x"), LifetimeSanitizer("npu", warn_on_free=False))[1])
NpuBackend.current_stream = original
print(json.dumps(results))
