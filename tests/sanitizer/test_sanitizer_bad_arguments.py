"""Every public method of the sanitizer refuses bad input with one message
and changes nothing (issue 36, item 8): report('abc'), report([object()]),
to_json([1]) and summary([object()]) raised AttributeError from inside,
describe('x') IndexError; suppressions=42 was accepted; record_use,
track_allocation and the on_* handlers took garbage stream keys, and
correct ops then got false races."""
import gc

import pytest
import torch

from npu_lifetime import simdevice as sd
from npu_lifetime.sanitizer import LifetimeSanitizer
from helpers.collecting import sanitizer

pytestmark = pytest.mark.usefixtures("both_ways")  # conftest.py: C parts, then Python's



@pytest.mark.parametrize("call", [
    lambda s: s.report("abc"), lambda s: s.report([object()]), lambda s: s.to_json([1]),
    lambda s: s.summary([object()]), lambda s: s.summary([], reports=-1), lambda s: s.failing("x"),
    lambda s: s.info(object()), lambda s: s.verdict(3), lambda s: s.count("f"),
    lambda s: s.describe("x"), lambda s: s.describe((0,)), lambda s: s.describe(None),
], ids=["report_str", "report_object", "to_json_int", "summary_object", "summary_reports", "failing_str",
        "info", "verdict", "count", "describe_str", "describe_short", "describe_none"])
def test_a_bad_findings_or_stream_argument_is_one_type_error(call):
    san = sanitizer()
    with pytest.raises(TypeError) as raised:
        call(san)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize("suppressions", [42, 1.5, ["rule"], object()])
def test_suppressions_of_the_wrong_type_are_refused(suppressions):
    with pytest.raises(TypeError, match="suppressions must be"):
        LifetimeSanitizer("sim", suppressions=suppressions)


@pytest.mark.parametrize("call", [
    lambda s, t: s.record_use(t, "side"), lambda s, t: s.record_use(t, (0, "x")),
    lambda s, t: s.record_stream(t, None), lambda s, t: s.erase_stream(t, (0,)),
    lambda s, t: s.track_allocation(t, "default"), lambda s, t: s.record_use("t", (0, 1)),
    lambda s, t: s.on_wait_stream((0, 0), "garbage"), lambda s, t: s.on_stream_sync([0, 1]),
    lambda s, t: s.on_event_record(12345, ("a", "b")),
], ids=["record_use_str", "record_use_handle", "record_stream_none", "erase_short", "track_str",
        "record_use_tensor", "wait_stream", "stream_sync", "event_record"])
def test_a_garbage_stream_key_is_refused_and_changes_nothing(call):
    with sanitizer() as san:
        x = torch.ones(8)
        streams_before = set(san.model.streams) if hasattr(san.model, "streams") else None
        with pytest.raises(TypeError):
            call(san, x)
        if streams_before is not None:
            assert set(san.model.streams) == streams_before
        # correct ops after it get no false race
        side = sd.Stream()
        side.wait_stream(sd.default_stream())
        with sd.stream(side):
            y = x * 2
        sd.default_stream().wait_stream(side)
        del x, y
        gc.collect()
    assert san.failing(san.flush()) == []


def test_good_arguments_still_work():
    with sanitizer() as san:
        side = sd.Stream()
        x = torch.ones(4)
        with sd.stream(side):
            x + 1
    found = san.flush()
    assert found and isinstance(san.report(found), str) and san.to_json(found)
    assert san.summary(found, reports=1)["findings"]
    assert san.describe(side.key)
