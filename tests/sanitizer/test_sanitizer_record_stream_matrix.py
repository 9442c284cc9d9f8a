"""torch_npu's own record_stream sanitizer tests (Ascend/pytorch,
test/npu/test_sanitizer_record_stream.py), ported to the lifetime sanitizer
and run over every device: the simulated one, CUDA where there is a GPU, and
the real torch_npu (over the stand-in CANN runtime, through
tests/platforms/test_npu_suites.py).  As there, the sanitizer is enabled at the start
of each test, before its first device op (in a fresh torch_npu process the
first test enables it before torch_npu has initialised the device).

torch_npu's sanitizer reports a missing record_stream at deallocation
(``record_stream_errors``) and, for live tensors, at
``flush_record_stream_warnings()``: here both are ``UncoveredFree`` findings
from ``flush()`` (``live`` for the second); its data races
(``CUDASanitizerErrors``) are ``DataRace`` findings.  Each scenario's
expected verdict is torch_npu's.
"""
import gc

import pytest

from npu_lifetime.lifetime import DataRace, UncoveredFree
from npu_lifetime.sanitizer import LifetimeSanitizer

from helpers.stream_devices import DEVICES

pytestmark = [pytest.mark.parametrize("dev", DEVICES),
              pytest.mark.usefixtures("both_ways")]  # conftest.py: C parts, then Python's


@pytest.fixture
def san(dev):
    sanitizer = LifetimeSanitizer(dev.name, on_race="collect", warn_on_free=False)
    with sanitizer:
        yield sanitizer


def uncovered(findings, live: bool = True) -> list:
    return [f for f in findings if isinstance(f, UncoveredFree) and f.live == live]


def races(findings) -> list:
    return [f for f in findings if isinstance(f, DataRace)]


def read_on(dev, stream, tensor, after_default: bool = True):
    """A read of ``tensor`` on ``stream``, ordered after the default stream
    (as torch_npu's tests do with ``stream.wait_stream(default_stream)``)."""
    if after_default:
        stream.wait_stream(dev.default_stream())
    with dev.stream(stream):
        (tensor + 1).sum()


def randn(dev, n=100):
    return dev.ones(n) * 0.5


# data races
def test_write_read_race(dev, san):
    x = randn(dev)
    read_on(dev, dev.Stream(), x, after_default=False)
    assert races(san.flush())


def test_record_stream_does_not_fix_a_data_race(dev, san):
    x = randn(dev)
    side = dev.Stream()
    _record_stream(x, side)
    read_on(dev, side, x, after_default=False)
    assert races(san.flush())


# missing record_stream
def test_cross_stream_use_without_record_stream(dev, san):
    x = randn(dev)
    read_on(dev, dev.Stream(), x)
    found = san.flush()
    assert uncovered(found) and not races(found)


def test_each_stream_needs_its_own_coverage(dev, san):
    x = randn(dev)
    s1, s2 = dev.Stream(), dev.Stream()
    read_on(dev, s1, x)
    read_on(dev, s2, x)
    assert len({f.usage_stream for f in uncovered(san.flush())}) == 2


# record_stream not needed
def test_record_stream_covers(dev, san):
    x = randn(dev)
    side = dev.Stream()
    _record_stream(x, side)
    read_on(dev, side, x)
    assert san.flush() == []


def test_creation_stream_waiting_for_the_usage_stream_covers(dev, san):
    x = randn(dev)
    side = dev.Stream()
    read_on(dev, side, x)
    dev.default_stream().wait_stream(side)
    assert san.flush() == []


def test_creation_stream_waiting_on_an_event_of_the_usage_stream_covers(dev, san):
    x = randn(dev)
    side = dev.Stream()
    read_on(dev, side, x)
    dev.default_stream().wait_event(side.record_event())
    assert san.flush() == []


def test_device_synchronize_covers(dev, san):
    x = randn(dev)
    read_on(dev, dev.Stream(), x)
    dev.synchronize()
    assert san.flush() == []


# what a wait covers: only the uses before it
def test_a_reverse_wait_covers_only_earlier_uses(dev, san):
    x = randn(dev)
    side = dev.Stream()
    read_on(dev, side, x)
    dev.default_stream().wait_stream(side)
    read_on(dev, side, x, after_default=False)
    assert uncovered(san.flush())


def test_an_event_wait_covers_only_earlier_uses(dev, san):
    x = randn(dev)
    side = dev.Stream()
    read_on(dev, side, x)
    dev.default_stream().wait_event(side.record_event())
    read_on(dev, side, x, after_default=False)
    assert uncovered(san.flush())


def test_record_stream_on_one_stream_does_not_cover_another(dev, san):
    x = randn(dev)
    s1, s2 = dev.Stream(), dev.Stream()
    _record_stream(x, s1)
    read_on(dev, s1, x)
    read_on(dev, s2, x)
    streams = {f.usage_stream for f in uncovered(san.flush())}
    assert streams == {san.backend.stream_key(s2)}


# views and slices: tracked per storage
def test_a_view_used_across_streams_needs_coverage(dev, san):
    x = randn(dev)
    read_on(dev, dev.Stream(), x[10:50])
    assert uncovered(san.flush())


def test_record_stream_on_the_base_covers_a_view(dev, san):
    x = randn(dev)
    side = dev.Stream()
    _record_stream(x, side)
    read_on(dev, side, x[10:50])
    assert san.flush() == []


def test_record_stream_on_a_view_covers_the_base(dev, san):
    x = randn(dev)
    side = dev.Stream()
    _record_stream(x[10:50], side)
    read_on(dev, side, x)
    assert san.flush() == []


# memory reuse: a new allocation starts clean
def test_a_new_allocation_inherits_no_recorded_stream(dev, san):
    side = dev.Stream()
    x = randn(dev)
    _record_stream(x, side)
    del x
    y = randn(dev)
    read_on(dev, side, y)
    assert uncovered(san.flush())


def test_a_new_allocation_with_its_own_record_stream(dev, san):
    side = dev.Stream()
    x = randn(dev)
    del x
    y = randn(dev)
    _record_stream(y, side)
    read_on(dev, side, y)
    assert san.flush() == []


# at deallocation
def test_a_free_without_coverage_is_reported_at_the_free(dev, san):
    side = dev.Stream()
    x = randn(dev)
    read_on(dev, side, x)
    del x
    gc.collect()
    dev.let_go()
    assert uncovered(san.flush(), live=False)


def _record_stream(tensor, stream):
    """Tensor.record_stream, or its simulated-device counterpart."""
    import npu_lifetime

    npu_lifetime.record_stream(tensor, stream)
