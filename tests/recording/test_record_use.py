"""record_use on the simulated device: the fast path reaches the shim with no
detour, a watching sanitizer and torch.compile go through the custom op,
bad input is refused clearly, and Tensor.record_use is strictly opt-in.
(The CUDA path is the same code with another route: test_gpu_record_use.py.)"""
import pytest
import torch

import npu_lifetime
from npu_lifetime import recording, shim, simdevice as sd
from npu_lifetime.handoff import SimHandoffDevice
from npu_lifetime.recording import RecordUseError, shim_route
from npu_lifetime.recording import calls as record_use_calls
from npu_lifetime.sanitizer import LifetimeSanitizer
from helpers.stream_devices import used_on_side

# record_use's C entry and fast path, then its Python reference (conftest.py)
pytestmark = pytest.mark.usefixtures("record_both_ways")

@pytest.fixture
def dev(sim_shim):
    """Buffers from the shim's simulated runtime; record_use reaches the shim."""
    device = SimHandoffDevice()
    with shim_route(device.route):
        yield device


def test_each_instance_runs_its_own_fast_path(dev, record_both_ways):
    """The switch reaches the route: _entry.c's ShimFast, or calls.py's reference."""
    in_c = type(dev.route.fast).__module__ == "npu_lifetime.recording._entry"
    assert in_c == (record_both_ways == "native")


def use_events(dev, t) -> dict:
    """{raw stream handle: event} of the shim block holding ``t``."""
    ptr = t.untyped_storage().data_ptr()
    blocks = [b for seg in shim.snapshot()["segments"] for b in seg["blocks"] if b["address"] == ptr]
    assert len(blocks) == 1, blocks
    return {e["stream"]: e for e in blocks[0]["use_events"]}


def test_fast_path_reaches_the_shim_without_the_checked_path(dev, monkeypatch):
    owner, side = sd.Stream(), sd.Stream()
    x = dev.empty(64, owner)
    monkeypatch.setattr(record_use_calls, "_record_use_checked", lambda *a: pytest.fail("left the fast path"))
    npu_lifetime.record_use(x, side)
    with sd.stream(side):
        npu_lifetime.record_use(x[8:16])  # a view, the current stream
    assert set(use_events(dev, x)) == {dev.handle(side)}
    assert shim.stats()["events_recorded"] >= 1


def test_a_use_on_the_allocation_stream_attaches_nothing(dev):
    owner = sd.Stream()
    x = dev.empty(64, owner)
    npu_lifetime.record_use(x, owner)
    assert use_events(dev, x) == {}


def read_on_a_side_stream(dev):
    """(x, side): x, a shim buffer of an owner stream, read on side after side waited for the owner."""
    owner, side = sd.Stream(), sd.Stream()
    x = dev.empty(64, owner)
    side.wait_stream(owner)
    with sd.stream(side):
        x.sum()
    return x, side


def test_a_watching_sanitizer_sees_the_call_and_the_shim_still_gets_it(dev, monkeypatch):
    san = LifetimeSanitizer("sim", on_race="collect", warn_on_free=False)  # knows the op before the spy
    calls, op = [], record_use_calls._OP
    monkeypatch.setattr(record_use_calls, "_OP", lambda *args: (calls.append(args[1:]), op(*args)))
    with san:
        x, side = read_on_a_side_stream(dev)
        npu_lifetime.record_use(x, side)
        events = use_events(dev, x)
        del x
    assert calls == [(side.handle, 0, 0)]  # through the op: (handle, device index, cpu)
    found = san.flush()
    assert found == [], san.report(found)  # covered: the sanitizer saw the call
    assert set(events) == {dev.handle(side)}  # and the shim got it


def test_without_record_use_the_sanitizer_reports_the_free(dev):
    # the control for the test above: the same program minus the call
    san = LifetimeSanitizer("sim", on_race="collect", warn_on_free=False)
    with san:
        x, side = read_on_a_side_stream(dev)
        del x
    assert [f.kind for f in san.flush()] == ["uncovered_free"]


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("explicit_stream", [True, False])
def test_record_use_traces_under_torch_compile_fullgraph(dev, backend, explicit_stream):
    torch._dynamo.reset()
    owner, side = sd.Stream(), sd.Stream()
    x = dev.empty(64, owner)
    x.fill_(1.0)

    @torch.compile(fullgraph=True, backend=backend)
    def step(t):
        if explicit_stream:
            npu_lifetime.record_use(t, side)
        else:
            npu_lifetime.record_use(t)
        return t * 2

    with sd.stream(side):
        out = step(x)
    assert torch.equal(out, torch.full((64,), 2.0))
    assert set(use_events(dev, x)) == {dev.handle(side)}  # the compiled graph ran the op


def test_compiled_call_without_a_stream_follows_the_current_stream(dev):
    torch._dynamo.reset()
    owner, a, b = sd.Stream(), sd.Stream(), sd.Stream()
    x, y = dev.empty(16, owner), dev.empty(16, owner)
    step = torch.compile(lambda t: (npu_lifetime.record_use(t), t + 1)[1], fullgraph=True, backend="aot_eager")
    with sd.stream(a):
        step(x)
    with sd.stream(b):
        step(y)  # dynamo guards on the current stream: recompiled, not stream a baked in
    assert set(use_events(dev, x)) == {dev.handle(a)} and set(use_events(dev, y)) == {dev.handle(b)}


def test_the_fallback_fast_path_steps_aside_while_dynamo_traces(monkeypatch):
    """The fast path to the torch-allocator fallback asks is_dynamo_compiling (one
    Python call, folded to True by dynamo) where the checked path asks
    is_compiling: traced, it must leave the call to the op; eager, it records."""
    torch._dynamo.reset()
    recorded = []
    fast = record_use_calls.fallback_fast_path(lambda t, s: recorded.append(s) or True, "is_cpu", lambda d: "current")
    monkeypatch.setattr(record_use_calls, "_fast", fast)
    ops = []
    monkeypatch.setattr(record_use_calls, "_record_use_traced", lambda t, s: ops.append(s))

    @torch.compile(fullgraph=True, backend="eager")
    def step(t):
        npu_lifetime.record_use(t, "side")
        return t + 1

    step(torch.ones(2))
    assert ops == ["side"] and recorded == []  # traced: the op's path, the fast path never ran
    npu_lifetime.record_use(torch.ones(2))
    assert recorded == ["current"]  # eager: the fast path, the current stream for None


@pytest.mark.parametrize("bad, message", [
    (lambda x, s: npu_lifetime.record_use([1, 2], s), "needs a tensor"),
    (lambda x, s: npu_lifetime.record_use(x, torch.cpu.Stream()), "takes a simdevice stream"),
    (lambda x, s: npu_lifetime.record_use(x, "stream"), "takes a simdevice stream"),
    (lambda x, s: npu_lifetime.record_use(torch.ones(2, device="meta"), s), "goes with CPU tensors"),
    (lambda x, s: npu_lifetime.record_use(torch.ones(2, device="meta")), "cuda or npu tensor"),
])
def test_bad_input_is_refused_with_what_to_do(dev, bad, message):
    side = sd.Stream()
    x = dev.empty(8, side)
    with pytest.raises(RecordUseError, match=message):
        bad(x, side)


def test_memory_the_shim_does_not_know_is_refused(dev):
    with pytest.raises(RecordUseError, match="does not know the storage"):
        npu_lifetime.record_use(torch.ones(8), sd.Stream())  # host memory, not a shim block
    shim.findings()  # the shim reported it too; drained so the fixture starts clean


def test_a_freed_storage_is_refused(dev):
    owner = sd.Stream()
    x = torch.ones(8)  # resizable host memory; the route sees address 0 once it is freed
    x.untyped_storage().resize_(0)
    with pytest.raises(RecordUseError, match="freed storage"):
        npu_lifetime.record_use(x, owner)
    assert shim.findings() == []  # refused before reaching the shim


def test_without_a_route_cpu_tensors_only_inform_the_sanitizer(sim_shim):
    san = LifetimeSanitizer("sim", on_race="collect", warn_on_free=False)
    with san:
        x, side = used_on_side(4)
        npu_lifetime.record_use(x, side)
        del x
    assert san.flush() == [] and shim.stats()["events_recorded"] == 0


def test_tensor_record_use_method_is_opt_in():
    assert not hasattr(torch.Tensor, "record_use")
    recording.install_tensor_method()
    recording.install_tensor_method()  # idempotent
    try:
        san = LifetimeSanitizer("sim", on_race="collect", warn_on_free=False)
        with san:
            x, side = used_on_side(4)
            x.record_use(side)
            del x
        assert san.flush() == []
    finally:
        recording.uninstall_tensor_method()
    assert not hasattr(torch.Tensor, "record_use")


def test_tensor_method_never_replaces_one_torch_ships():
    def torch_own(self, stream=None):
        return "torch's"

    torch.Tensor.record_use = torch_own
    try:
        with pytest.raises(RecordUseError, match="already exists"):
            recording.install_tensor_method()
        recording.uninstall_tensor_method()  # not ours: left alone
        assert torch.Tensor.record_use is torch_own
    finally:
        del torch.Tensor.record_use


def test_any_dispatch_mode_in_this_thread_leaves_the_fast_path(dev, monkeypatch):
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Spy(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    owner, side = sd.Stream(), sd.Stream()
    x = dev.empty(16, owner)
    checked = []
    original = record_use_calls._record_use_checked
    monkeypatch.setattr(record_use_calls, "_record_use_checked", lambda *a: (checked.append(a), original(*a)))
    with Spy():
        npu_lifetime.record_use(x, side)
    assert len(checked) == 1  # a mode might want the op: not the fast path
    assert set(use_events(dev, x)) == {dev.handle(side)}


def test_the_public_name_is_the_function_itself():
    # no wrapper in between: a wrapper's import statement cost ~1 us a call
    assert npu_lifetime.record_use is recording.record_use
