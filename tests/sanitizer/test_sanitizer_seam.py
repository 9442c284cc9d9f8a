"""The seam between the sanitizer and its C parts (native.py's ``Parts``):
a sanitizer is built with one set of parts, C or Python, chosen once; the
Python set never calls C; the shim's per-allocation path (the storage
feed's ``shim_alloc`` / ``shim_free``) finds the same both ways."""
import gc
import random

import pytest
import torch

from npu_lifetime import simdevice as sd
from npu_lifetime.sanitizer import LifetimeSanitizer, feeds, native

PYTHON_CLASSES = {"host_lock": feeds.HostLock, "op_feed": feeds.feed_op, "storage_feed": feeds.StorageFeed,
                  "event_feed": feeds.EventFeed}


def test_the_python_parts_are_the_reference_classes():
    parts = native.python_parts()
    assert {name: getattr(parts, name) for name in PYTHON_CLASSES} == PYTHON_CLASSES
    assert parts.dispatch is None and parts.model.__module__ == "npu_lifetime.lifetime.model"


def test_a_python_sanitizer_holds_no_c_part():
    san = LifetimeSanitizer("sim", parts=native.python_parts())
    modules = [type(part).__module__ for part in (san._lock, san._storage_feed, san._events, san.model)]
    modules.append(san._op_feed.__module__)  # a function
    assert all(m.startswith("npu_lifetime.") and not m.split(".")[-1].startswith("_") for m in modules), modules


@pytest.mark.usefixtures("both_ways")
def test_the_fixture_builds_the_sanitizer_with_its_instance_s_parts(both_ways):
    san = LifetimeSanitizer("sim")
    assert san.parts.name == both_ways
    python = both_ways == "python"
    assert isinstance(san._events, feeds.EventFeed) is python
    assert isinstance(san._storage_feed, feeds.StorageFeed) is python
    assert (san._op_feed is feeds.feed_op) is python


def _shim_program(seed: int, parts) -> list:
    """Random shim allocations and frees (through the storage feed's shim
    calls, as hooks.py makes them) of four storages, used on three streams."""
    rng = random.Random(seed)
    tensors = [torch.ones(16) for _ in range(4)]  # made before the sanitizer: only the shim allocates them
    san = LifetimeSanitizer("sim", on_race="collect", warn_on_free=False, parts=parts)
    with san:
        feed = san._storage_feed
        streams = [sd.default_stream(), sd.Stream(), sd.Stream()]
        live = set()
        for _ in range(30):
            kind, s, t = rng.choice(["alloc", "free", "read", "write", "wait"]), rng.randrange(3), rng.randrange(4)
            ptr, stream = tensors[t].data_ptr(), streams[s]
            with sd.stream(stream):
                if kind == "alloc":
                    feed.shim_alloc(ptr, 64, stream.key[0], stream.key[1])
                    live.add(t)
                elif kind == "free" and t in live:
                    found = feed.shim_free(ptr, 64, stream.key[0], stream.key[1])
                    if found:
                        san._free_found(found)
                    live.discard(t)
                elif kind == "read" and t in live:
                    tensors[t].sum()
                elif kind == "write" and t in live:
                    tensors[t].add_(1)
                elif kind == "wait":
                    stream.wait_stream(streams[(s + 1) % 3])
    del tensors
    gc.collect()
    return sorted(f"{f.kind}: {san.report([f]).splitlines()[0]}" for f in san.flush())


@pytest.mark.skipif(native.storage_feed is None, reason="the native storage feed is off or not built")
@pytest.mark.parametrize("seed", range(15))
def test_the_shim_path_finds_the_same_both_ways(seed):
    found = _shim_program(seed, native.native_parts())
    assert found == _shim_program(seed, native.python_parts())


def test_the_shim_programs_make_findings():
    kinds = {line.split(":")[0] for seed in range(15) for line in _shim_program(seed, native.python_parts())}
    assert "uncovered_free" in kinds, kinds
