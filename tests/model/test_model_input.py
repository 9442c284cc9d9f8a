"""Bad input to the lifetime model: a finding for program bugs, a clear
error for malformed event streams, never a silent pass."""
import json

import pytest

from npu_lifetime.lifetime import (
    InvalidFree,
    ModelInputError,
    UncoveredFree,
    UnrecordedEventWait,
    UseAfterFree,
    finding_to_json,
)

pytestmark = pytest.mark.usefixtures("model_both_ways")  # conftest.py: the C++ model, then model.py's


@pytest.fixture
def model(model_both_ways):
    m = model_both_ways()
    for s in ("A", "U"):
        m.create_stream(s)
    m.create_event("e")
    return m


def test_free_of_unknown_storage(model):
    [finding] = model.free("nope", site="here")
    assert isinstance(finding, InvalidFree) and finding.reason == "unknown"


def test_double_free_names_the_first_free(model):
    model.allocate("x", "A")
    model.free("x", site="first")
    [finding] = model.free("x", site="second")
    assert (finding.reason, finding.site, finding.first_free_site) == ("double", "second", "first")


@pytest.mark.parametrize("call", [
    lambda m: m.read("x", "U", op="aten::add"),
    lambda m: m.write("x", "A"),
    lambda m: m.record_stream("x", "U"),
    lambda m: m.record_use("x", "U"),
    lambda m: m.erase_stream("x", "U"),
])
def test_use_after_free(model, call):
    model.allocate("x", "A")
    model.free("x", site="f")
    call(model)
    [finding] = model.flush()
    assert isinstance(finding, UseAfterFree) and finding.free_site == "f"


def test_wait_on_never_recorded_event(model):
    model.wait_event("A", "e", site="w")
    model.synchronize_event("e", site="h")
    assert model.flush() == [UnrecordedEventWait("e", "A", "w"), UnrecordedEventWait("e", None, "h")]


def test_unknown_stream_and_event_are_errors(model):
    model.allocate("x", "A")
    with pytest.raises(ModelInputError, match="unknown stream 'Z'"):
        model.read("x", "Z")
    with pytest.raises(ModelInputError, match="unknown event"):
        model.record_event("nope", "A")
    with pytest.raises(ModelInputError, match="unknown stream"):
        model.allocate("y", "Z")
    with pytest.raises(ModelInputError, match="unknown storage"):
        model.read("never", "A")


def test_allocation_over_live_storage_is_an_error(model):
    model.allocate("x", "A", address=0x1000)
    with pytest.raises(ModelInputError, match="while live"):
        model.allocate("x", "A")
    with pytest.raises(ModelInputError, match="0x1000"):
        model.allocate("y", "A", address=0x1000)


def test_findings_reach_the_callback_at_once(model_both_ways):
    seen = []
    m = model_both_ways(on_finding=seen.append)
    m.create_stream(0)
    m.free(7)
    assert len(seen) == 1 and isinstance(seen[0], InvalidFree)


def test_flush_clears_retained_and_recomputes_live(model):
    model.allocate("x", "A", site="alloc")
    model.wait_stream("U", "A")
    model.read("x", "U", op="aten::mul", site="use")
    first = model.flush()
    assert [type(f) for f in first] == [UncoveredFree] and first[0].live
    assert model.flush() == first  # still live, still uncovered
    model.record_use("x", "U")
    assert model.flush() == []


def test_device_synchronize_is_per_device(model_both_ways):
    m = model_both_ways()
    m.create_stream("A", device=0)
    m.create_stream("U", device=0)
    m.create_stream("B", device=1)
    m.allocate("x", "A")
    m.wait_stream("U", "A")
    m.read("x", "U")
    m.synchronize_device(1)
    assert [f.kind for f in m.free("x")] == ["uncovered_free"]


def test_every_finding_is_json(model_both_ways):
    m = model_both_ways()
    m.create_stream(0)
    m.create_stream(1)
    m.create_event(0)
    m.allocate("x", 0, address=0x2000, size=64, site=("f.py", 3, "main"))
    m.read("x", 1, op="aten::sum", site="use")
    m.wait_event(1, 0)
    m.free("x")
    m.free("x")
    m.read("x", 0)
    kinds = [finding_to_json(f) for f in m.flush()]
    text = json.dumps(kinds)
    assert {k["kind"] for k in kinds} == {
        "data_race", "unrecorded_event_wait", "uncovered_free", "invalid_free", "use_after_free"
    }
    assert all(k["fix"] for k in kinds) and "aten::sum" in text
