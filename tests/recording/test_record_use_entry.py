"""record_use's C entry (recording/_entry.c) against its Python reference
(calls.record_use_reference, _ShimRoute.make_fast_reference), on the
shim's simulated runtime: the same inputs give the same outcome (done, the
error and its message) and leave the shim in the same state; bad arguments,
a stream of another device and a tensor the shim does not know are refused
as the reference refuses them, without leaking a reference.  Skips where
the extension is not built or NPU_LIFETIME_NATIVE=0 (the reference is then
the entry, and test_record_use.py runs it)."""
import re
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import npu_lifetime
from npu_lifetime import recording, shim, simdevice as sd
from npu_lifetime.handoff import SimHandoffDevice
from npu_lifetime.recording import calls

pytestmark = pytest.mark.skipif(calls._entry is None, reason="the C entry is not built or NPU_LIFETIME_NATIVE=0")


@pytest.fixture
def dev(sim_shim):
    device = SimHandoffDevice()
    with recording.shim_route(device.route):
        yield device


def use_streams(t) -> set:
    """The raw stream handles with a use event on the shim block holding ``t``."""
    ptr = t.untyped_storage().data_ptr()
    for seg in shim.snapshot()["segments"]:
        for b in seg["blocks"]:
            if b["address"] == ptr:
                return {e["stream"] for e in b["use_events"]}
    return set()


def outcome(call):
    try:
        result = call()
    except Exception as err:  # noqa: BLE001 - the outcome compared is the error itself
        return type(err).__name__, re.sub(r"0x[0-9a-f]+", "0x?", str(err))  # objects' addresses differ
    return "done", result


def other_device_stream():
    s = sd.Stream()
    s.device_index = sd.DEVICE_INDEX + 1
    return s


# (tensor maker, stream maker): each pair is run through both entries on fresh tensors
TENSORS = {
    "shim buffer": lambda dev, owner: dev.empty(64, owner),
    "a view of one": lambda dev, owner: dev.empty(64, owner)[8:16],
    "no elements": lambda dev, owner: dev.empty(64, owner)[:0],
    "not the shim's": lambda dev, owner: torch.ones(4),
    "not a tensor": lambda dev, owner: [1, 2],
}
STREAMS = {
    "side": lambda owner: sd.Stream(),
    "owner": lambda owner: owner,
    "current (None)": lambda owner: None,
    "another device's": lambda owner: other_device_stream(),
    "not a stream": lambda owner: "side",
    "a torch.cpu.Stream": lambda owner: torch.cpu.Stream(),
}


def run_both(dev, make_tensor, make_stream, entry_of, current=None):
    """[(outcome, use streams)] of ``entry_of(native)`` for the C entry, then the reference."""
    results = []
    for native in (True, False):
        owner = sd.Stream()
        tensor, stream = make_tensor(dev, owner), make_stream(owner)
        entry = entry_of(native, dev)
        with sd.stream(current or sd.Stream()):
            got = outcome(lambda: entry(tensor, stream))
        used = use_streams(tensor) if isinstance(tensor, torch.Tensor) and tensor.numel() else set()
        # handles differ between the runs (new streams): compare which role was recorded
        results.append((got, {"owner" if h == dev.handle(owner) else "other" for h in used}))
    return results


def the_entry(native, dev):
    if native:
        return calls.record_use
    reference_route = recording.simulated_route(dev.handle)
    reference_route.fast = reference_route.make_fast_reference()
    calls._routes["cpu"], calls._fast = reference_route, reference_route.fast
    return calls.record_use_reference


@pytest.mark.parametrize("stream_kind", STREAMS)
@pytest.mark.parametrize("tensor_kind", TENSORS)
def test_the_c_entry_does_what_the_reference_does(dev, tensor_kind, stream_kind):
    native, reference = run_both(dev, TENSORS[tensor_kind], STREAMS[stream_kind], the_entry)
    assert native == reference


def the_fast_path(native, dev):
    route = recording.simulated_route(dev.handle)
    return route.fast if native else route.make_fast_reference()


@pytest.mark.parametrize("stream_kind", STREAMS)
@pytest.mark.parametrize("tensor_kind", TENSORS)
def test_the_c_fast_path_answers_as_the_python_one(dev, tensor_kind, stream_kind):
    native, reference = run_both(dev, TENSORS[tensor_kind], STREAMS[stream_kind], the_fast_path)
    assert native == reference


@settings(deadline=None)
@given(st.lists(st.tuples(st.sampled_from(sorted(TENSORS)), st.sampled_from(sorted(STREAMS))), max_size=6))
def test_any_sequence_of_calls_leaves_both_alike(sequence):
    shim.reset()
    shim.select_runtime("sim")
    shim.set_policy("poll")
    dev = SimHandoffDevice()
    with recording.shim_route(dev.route):
        for tensor_kind, stream_kind in sequence:
            native, reference = run_both(dev, TENSORS[tensor_kind], STREAMS[stream_kind], the_entry)
            assert native == reference
    shim.reset()


def test_the_shim_refusing_a_storage_raises_the_reference_error(dev):
    stranger = torch.ones(4)  # host memory the shim never handed out
    with pytest.raises(recording.RecordUseError, match="does not know the storage"):
        npu_lifetime.record_use(stranger, sd.Stream())
    with pytest.raises(recording.RecordUseError, match="does not know the storage"):
        dev.route.fast(stranger, sd.Stream())


@pytest.mark.parametrize("call", [
    lambda: calls.record_use(),
    lambda: calls.record_use(torch.ones(1), sd.Stream(), 3),
    lambda: calls.record_use(torch.ones(1), nowhere=sd.Stream()),
    lambda: calls.record_use(stream=sd.Stream()),
])
def test_bad_arity_or_keywords_are_the_references_type_errors(dev, call):
    native = outcome(call)
    saved = calls.record_use
    try:
        calls.record_use = calls.record_use_reference
        reference = outcome(call)
    finally:
        calls.record_use = saved
    assert native[0] == reference[0] == "TypeError"


def test_keywords_reach_the_reference(dev):
    owner, side = sd.Stream(), sd.Stream()
    x = dev.empty(64, owner)
    npu_lifetime.record_use(tensor=x, stream=side)
    assert use_streams(x) == {dev.handle(side)}


def call_both(dev, tensor, stream) -> None:
    outcome(lambda: npu_lifetime.record_use(tensor, stream))
    outcome(lambda: dev.route.fast(tensor, stream))


def test_no_reference_is_leaked_on_any_path(dev):
    owner, side = sd.Stream(), sd.Stream()
    x, stranger, bad_stream = dev.empty(64, owner), torch.ones(4), other_device_stream()
    not_a_stream = "".join(["si", "de"])  # a string of its own: an interned literal's count moves with other code
    cases = [(x, side), (x, None), (x, owner), (stranger, side), (x, bad_stream), (x, not_a_stream), ([1], side)]
    storage = x.untyped_storage()  # the object each untyped_storage() call returns while it lives

    def counts():  # None's count is left out: any thread that runs (a reaper, the collector) moves it
        return [(sys.getrefcount(t), s is None or sys.getrefcount(s)) for t, s in cases], sys.getrefcount(storage)

    before = counts()
    for _ in range(200):
        for case in cases:
            call_both(dev, *case)
    assert counts() == before


def test_an_error_inside_a_callable_propagates_and_nothing_is_recorded(dev):
    owner, side = sd.Stream(), sd.Stream()
    x = dev.empty(64, owner)

    def broken_current(tensor):
        raise RuntimeError("no current stream")

    route = recording.simulated_route(dev.handle)
    route.current_handle = broken_current
    for fast in (route._make_fast(), route.make_fast_reference()):
        y = dev.empty(64, owner)
        with pytest.raises(RuntimeError, match="no current stream"):
            fast(y, None)
        assert use_streams(y) == set()
        assert fast(x, side) is True  # an explicit stream never asks
    assert use_streams(x) == {dev.handle(side)}


def test_the_fast_path_steps_aside_under_a_dispatch_mode(dev, monkeypatch):
    owner, side = sd.Stream(), sd.Stream()
    x = dev.empty(64, owner)
    checked = []
    monkeypatch.setattr(calls, "_record_use_checked", lambda t, s: checked.append(s))
    from torch.utils._python_dispatch import TorchDispatchMode

    class Watching(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Watching():
        npu_lifetime.record_use(x, side)
    assert checked == [side] and use_streams(x) == set()


@pytest.mark.parametrize("bad", [
    dict(npl_record_use=0),
    dict(stream_type="not a type"),
    dict(handle=3),
    dict(current_handle=None),
    dict(device_flag=b"is_cpu"),
])
def test_a_bad_shim_fast_is_refused_at_construction(bad):
    arguments = dict(npl_record_use=1, stream_type=sd.Stream, handle="handle", current_handle=len,
                     device_flag="is_cpu", device_index=len, refused=RuntimeError, dispatch_modes=int)
    arguments.update(bad)
    with pytest.raises((TypeError, ValueError)):
        calls._entry.ShimFast(**arguments)


def test_tensor_record_use_reaches_the_c_entry_and_traces_under_torch_compile(dev):
    """Tensor.record_use stays a Python function over the C entry: as a
    method descriptor of torch.Tensor, dynamo took it for torch's own
    method and fullgraph failed (Unsupported)."""
    torch._dynamo.reset()
    recording.install_tensor_method()
    try:
        owner, a, b, side = sd.Stream(), sd.Stream(), sd.Stream(), sd.Stream()
        x = dev.empty(64, owner)
        x.record_use(a)
        with sd.stream(b):
            x[4:8].record_use()
        assert use_streams(x) == {dev.handle(a), dev.handle(b)}
        y = dev.empty(64, owner)
        y.fill_(1.0)

        @torch.compile(fullgraph=True, backend="eager")
        def step(t):
            t.record_use(side)
            return t * 2

        assert torch.equal(step(y), torch.full((64,), 2.0))
        assert use_streams(y) == {dev.handle(side)}
        with pytest.raises(recording.RecordUseError, match="takes a simdevice stream"):
            x.record_use("side")
    finally:
        recording.uninstall_tensor_method()
    assert not hasattr(torch.Tensor, "record_use")


def device_type_route(dev):
    """The sim route with the C path's device check as tensor.device.type
    (what the npu route uses: torch_npu's is_npu is a Python property)."""
    return calls._ShimRoute("cpu", sd.Stream, handle=dev.handle, current_handle=lambda t: dev.handle(sd.current_stream()),
                            device_flag="is_cpu", device_index=lambda t: sd.DEVICE_INDEX, native_device_type="cpu")


@pytest.mark.parametrize("stream_kind", STREAMS)
@pytest.mark.parametrize("tensor_kind", TENSORS)
def test_the_device_type_check_answers_as_the_flag_does(dev, tensor_kind, stream_kind):
    def fast_of(native, dev):
        route = device_type_route(dev)
        return route.fast if native else route.make_fast_reference()

    native, reference = run_both(dev, TENSORS[tensor_kind], STREAMS[stream_kind], fast_of)
    assert native == reference


def test_the_device_type_check_refuses_a_meta_tensor(dev):
    fast = device_type_route(dev).fast
    assert fast(torch.empty(4, device="meta"), sd.Stream()) is False


@pytest.mark.parametrize("bad", [dict(device_type=3), dict(stream_handle=0), dict(stream_handle="f")])
def test_bad_native_options_are_refused_at_construction(bad):
    arguments = dict(npl_record_use=1, stream_type=sd.Stream, handle="handle", current_handle=len,
                     device_flag="is_cpu", device_index=len, refused=RuntimeError, dispatch_modes=int)
    with pytest.raises((TypeError, ValueError)):
        calls._entry.ShimFast(**arguments, **bad)
