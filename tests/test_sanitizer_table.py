"""The brief's table on real torch ops, through the sanitizer front end,
on the simulated device (CPU tensors, simdevice streams).  The same rows
run on real CUDA streams in test_gpu_sanitizer.py."""
import gc

import pytest
import torch

import npu_lifetime
from npu_lifetime import simdevice as sd
from npu_lifetime.lifetime import DataRace, UncoveredFree
from npu_lifetime.sanitizer import LifetimeSanitizer


def run(body):
    """Runs body(x, side) with x created on the default stream; returns
    (data race?, free covered?)."""
    san = LifetimeSanitizer("sim", on_race="collect", warn_on_free=False)
    with san:
        side = sd.Stream()
        x = torch.ones(256)
        body(x, side)
        del x
        gc.collect()
    found = san.flush()
    race = any(isinstance(f, DataRace) for f in found)
    covered = not any(isinstance(f, UncoveredFree) and not f.live for f in found)
    return race, covered


def use(x, side):
    with sd.stream(side):
        x.sum()


def test_no_sync_at_all():
    assert run(use) == (True, False)


def test_u_waits_for_a_only():
    def body(x, side):
        side.wait_stream(sd.default_stream())
        use(x, side)
    assert run(body) == (False, False)


def test_a_waits_for_u_after_the_use():
    def body(x, side):
        use(x, side)
        sd.default_stream().wait_stream(side)
    assert run(body) == (True, True)


def test_both_directions():
    def body(x, side):
        side.wait_stream(sd.default_stream())
        use(x, side)
        sd.default_stream().wait_stream(side)
    assert run(body) == (False, True)


def test_device_synchronize():
    def body(x, side):
        sd.synchronize()
        use(x, side)
        sd.synchronize()
    assert run(body) == (False, True)


@pytest.mark.parametrize("ordered", [False, True])
def test_record_stream(ordered):
    def body(x, side):
        if ordered:
            side.wait_stream(sd.default_stream())
        use(x, side)
        npu_lifetime.record_stream(x, side)
    assert run(body) == (not ordered, True)


@pytest.mark.parametrize("ordered", [False, True])
def test_record_use_after_the_last_use(ordered):
    def body(x, side):
        if ordered:
            side.wait_stream(sd.default_stream())
        use(x, side)
        npu_lifetime.record_use(x, side)
    assert run(body) == (not ordered, True)


def test_record_use_before_a_later_use():
    def body(x, side):
        side.wait_stream(sd.default_stream())
        use(x, side)
        npu_lifetime.record_use(x, side)
        use(x, side)
    assert run(body) == (False, False)


def test_same_stream():
    assert run(lambda x, side: x.sum()) == (False, True)


def test_views_and_slices_share_the_storage():
    def body(x, side):
        side.wait_stream(sd.default_stream())
        with sd.stream(side):
            x[10:20].sum()
        npu_lifetime.record_use(x.view(16, 16)[3], side)
    assert run(body) == (False, True)


def test_erase_stream_withdraws_record_stream():
    def body(x, side):
        side.wait_stream(sd.default_stream())
        use(x, side)
        npu_lifetime.record_stream(x, side)
        npu_lifetime.erase_stream(x, side)
    assert run(body) == (False, False)


def test_event_wait_and_query_cover():
    def body(x, side):
        side.wait_stream(sd.default_stream())
        use(x, side)
        e = side.record_event()
        assert e.query()
    assert run(body) == (False, True)
