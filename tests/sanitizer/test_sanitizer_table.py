"""The brief's table on real torch ops through the sanitizer front end: on
the simulated device (CPU tensors, simdevice streams) everywhere, and on
real CUDA streams where a GPU is present.  x is created on the default
stream A and used (read) on a side stream U."""
import gc

import pytest

import npu_lifetime
from npu_lifetime.lifetime import DataRace, UncoveredFree
from npu_lifetime.sanitizer import LifetimeSanitizer

from helpers.stream_devices import DEVICES

pytestmark = [pytest.mark.parametrize("dev", DEVICES),
              pytest.mark.usefixtures("both_ways")]  # conftest.py: C parts, then Python's


def run(dev, body):
    """Runs body(x, side) with x created on the default stream; returns
    (data race?, free covered?)."""
    san = LifetimeSanitizer(dev.name, on_race="collect", warn_on_free=False)
    with san:
        side = dev.Stream()
        x = dev.ones(256)
        body(x, side)
        del x
        gc.collect()
        dev.let_go()
    found = san.flush()
    race = any(isinstance(f, DataRace) for f in found)
    covered = not any(isinstance(f, UncoveredFree) and not f.live for f in found)
    return race, covered


def use(dev, x, side):
    with dev.stream(side):
        x.sum()


def test_no_sync_at_all(dev):
    assert run(dev, lambda x, side: use(dev, x, side)) == (True, False)


def test_u_waits_for_a_only(dev):
    def body(x, side):
        side.wait_stream(dev.default_stream())
        use(dev, x, side)
    assert run(dev, body) == (False, False)


def test_a_waits_for_u_after_the_use(dev):
    def body(x, side):
        use(dev, x, side)
        dev.default_stream().wait_stream(side)
    assert run(dev, body) == (True, True)


def test_both_directions(dev):
    def body(x, side):
        side.wait_stream(dev.default_stream())
        use(dev, x, side)
        dev.default_stream().wait_stream(side)
    assert run(dev, body) == (False, True)


def test_device_synchronize(dev):
    def body(x, side):
        dev.synchronize()
        use(dev, x, side)
        dev.synchronize()
    assert run(dev, body) == (False, True)


@pytest.mark.parametrize("ordered", [False, True])
@pytest.mark.parametrize("record", [npu_lifetime.record_stream, npu_lifetime.record_use], ids=lambda f: f.__name__)
def test_record_after_the_last_use(dev, record, ordered):
    def body(x, side):
        if ordered:
            side.wait_stream(dev.default_stream())
        use(dev, x, side)
        record(x, side)
    assert run(dev, body) == (not ordered, True)


def test_record_use_before_a_later_use(dev):
    def body(x, side):
        side.wait_stream(dev.default_stream())
        use(dev, x, side)
        npu_lifetime.record_use(x, side)
        use(dev, x, side)
    assert run(dev, body) == (False, False)


def test_same_stream(dev):
    assert run(dev, lambda x, side: x.sum()) == (False, True)


def test_views_and_slices_share_the_storage(dev):
    def body(x, side):
        side.wait_stream(dev.default_stream())
        with dev.stream(side):
            x[10:20].sum()
        npu_lifetime.record_use(x.view(16, 16)[3], side)
    assert run(dev, body) == (False, True)


def test_event_wait_covers(dev):
    def body(x, side):
        side.wait_stream(dev.default_stream())
        use(dev, x, side)
        dev.default_stream().wait_event(side.record_event())
    assert run(dev, body) == (False, True)


def test_event_query_that_returned_true_covers(dev):
    def body(x, side):
        side.wait_stream(dev.default_stream())
        use(dev, x, side)
        event = side.record_event()
        while not event.query():
            pass
    assert run(dev, body) == (False, True)


def test_stream_synchronize_covers(dev):
    def body(x, side):
        side.wait_stream(dev.default_stream())
        use(dev, x, side)
        side.synchronize()
    assert run(dev, body) == (False, True)
