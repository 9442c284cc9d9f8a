"""The issue-8 faults again, on one test body for the simulated device and
for real CUDA streams (the CUDA cases skip cleanly without a GPU): host
syncs inside ops, in-place metadata ops, storages from before enable, two
sanitizers at once, warnings as errors, grouped counts, reuse races."""
import gc
import warnings

import pytest

import npu_lifetime
from npu_lifetime.lifetime import DataRace, ReuseRace, UncoveredFree
from npu_lifetime.sanitizer import LifetimeSanitizer

from helpers.stream_devices import DEVICES, used_on_side
from helpers.collecting import sanitizer

pytestmark = [pytest.mark.parametrize("dev", DEVICES),
              pytest.mark.usefixtures("both_ways")]  # conftest.py: C parts, then Python's


def read_back_then_write(dev, read_back):
    """x is read back to the host on side (a host sync inside the op), then
    written on the default stream: ordered by that sync."""
    san = sanitizer(dev)
    with san:
        side = dev.Stream()
        x = dev.ones(64)
        side.wait_stream(dev.default_stream())
        with dev.stream(side):
            read_back(x)
        x.add_(1)
        del x
        gc.collect()
    return san.flush()


@pytest.mark.parametrize("read_back", [
    lambda t: t[3].item(), lambda t: float(t.sum()), lambda t: t.nonzero(), lambda t: bool(t[0] > 0),
], ids=["item", "float", "nonzero", "bool"])
def test_a_host_read_back_inside_an_op_orders_what_follows(dev, read_back):
    assert read_back_then_write(dev, read_back) == []


def test_a_blocking_copy_to_the_host_orders_what_follows(dev):
    if dev.name == "sim":
        pytest.skip("every simulated-device tensor is host memory: no copy to the host")
    assert read_back_then_write(dev, lambda t: t.cpu()) == []


def test_without_a_read_back_the_write_races(dev):
    found = read_back_then_write(dev, lambda t: t.sum())
    assert [f.race for f in found if isinstance(f, DataRace)] == ["write-after-read"]


@pytest.mark.parametrize("metadata_op", [lambda t: t.t_(), lambda t: t.unsqueeze_(0)], ids=["t_", "unsqueeze_"])
def test_in_place_metadata_ops_do_not_race(dev, metadata_op):
    san = sanitizer(dev)
    with san:
        side = dev.Stream()
        x = dev.ones(64).view(8, 8)
        side.wait_stream(dev.default_stream())
        with dev.stream(side):
            x.sum()
        metadata_op(x)
        npu_lifetime.record_use(x, side)
        del x
        gc.collect()
    assert san.flush() == []


def test_a_storage_from_before_enable_keeps_its_allocation_stream(dev):
    x = dev.ones(64)  # on the default stream, before the sanitizer
    san = sanitizer(dev)
    with san:
        side = dev.Stream()
        side.wait_stream(dev.default_stream())
        with dev.stream(side):
            x.sum()  # first seen here
        del x  # nothing covers the use on side
        gc.collect()
    [f] = san.flush()
    default = san.backend.default_stream(0)
    assert isinstance(f, UncoveredFree) and f.alloc_stream == default and f.usage_stream != default
    assert "before the sanitizer was enabled" in str(f.alloc_site)


def test_an_outer_sanitizer_sees_everything_after_an_inner_one_is_disabled(dev):
    outer = sanitizer(dev).enable()
    try:
        with sanitizer(dev):
            pass
        x, side = used_on_side(64, dev)
        npu_lifetime.record_use(x, side)
        del x
        gc.collect()
    finally:
        outer.disable()
    assert outer.flush() == []


def test_warnings_as_errors_lose_nothing(dev):
    san = LifetimeSanitizer(dev.name, on_race="collect", warn_on_free=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with san:
            streams = [dev.Stream(), dev.Stream()]
            x = dev.ones(64)
            for s in streams:
                s.wait_stream(dev.default_stream())
                with dev.stream(s):
                    x.sum()
            del x
            gc.collect()
    assert len([f for f in san.flush() if isinstance(f, UncoveredFree)]) == 2


def test_a_race_in_a_loop_is_one_finding_with_its_count(dev):
    san = sanitizer(dev)
    with san:
        side = dev.Stream()
        for _ in range(20):
            x = dev.ones(64)
            with dev.stream(side):
                x.sum()  # not ordered after the allocation on the default stream
            npu_lifetime.record_use(x, side)
            del x
        gc.collect()
    [race] = san.flush()
    assert isinstance(race, DataRace) and san.count(race) == 20


def owners_of_one_block(dev, race: bool):
    """x (on the default stream) read on side and freed uncovered; then a new
    owner of (part of) the same memory, written on the default stream after
    waiting for side or not."""
    san = sanitizer(dev)
    with san:
        side = dev.Stream()
        first, second = dev.REUSE_SIZES
        x = dev.reused_empty(first)
        x.fill_(1.0)
        address = x.data_ptr()
        side.wait_stream(dev.default_stream())
        with dev.stream(side):
            x.sum()
        del x  # uncovered
        gc.collect()
        if not race:
            dev.default_stream().wait_stream(side)  # the next owner waits for side first
        z = dev.reused_empty(second)  # on the simulated device, half of x's memory: a split block
        assert z.data_ptr() == address  # the memory really went to a new owner
        z.fill_(7.0)
        del z
        gc.collect()
    return san, san.flush()


def test_a_reuse_race_makes_the_uncovered_free_actual(dev):
    san, found = owners_of_one_block(dev, race=True)
    [race] = [f for f in found if isinstance(f, ReuseRace)]
    [free] = [f for f in found if isinstance(f, UncoveredFree) and not f.live]
    assert race.previous_use.op == "aten::sum" and race.access.op == "aten::fill_"
    assert san.info(free).actual and san.failing([free]) == [free]


def test_a_reuse_ordered_after_the_use_leaves_the_free_latent_and_says_why(dev):
    san, found = owners_of_one_block(dev, race=False)
    [free] = [f for f in found if isinstance(f, UncoveredFree) and not f.live]
    assert not any(isinstance(f, ReuseRace) for f in found)
    info = san.info(free)
    assert not info.actual and san.failing([free]) == [free]  # latent still breaks the contract
    assert "ordered after the use" in info.reasons[0][0]
    assert san.policy.verdict(free, info)[0] is True
