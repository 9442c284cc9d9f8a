"""The device allocation trace's native path (_trace_hook.c's Deliver and
Fire, _storage_feed.c's StorageFeed) gives the findings of the Python path
(Hub.direct, on_trace_alloc / on_trace_free, StorageTable), and Fire keeps
torch's other trace subscribers served.

The simulated device has no allocation trace: the trace's calls are made
here, on the simulated backend's hub, for storages of tensors made before the
sanitizer was enabled (so that only the trace tells the sanitizer of them)."""
import gc
import random

import pytest
import torch
from torch._utils import CallbackRegistry

from npu_lifetime import simdevice as sd
from npu_lifetime.sanitizer import LifetimeSanitizer, LifetimeWarning, native

if native.storage_feed is None or native.trace_hook is None:
    pytest.skip("the sanitizer's native trace feed is off or not built", allow_module_level=True)


def _subscribers(san, use_native: bool):
    """The allocation and free subscribers a trace backend registers."""
    hub = san.backend.hub
    device = lambda: sd.DEVICE_INDEX  # noqa: E731
    raw_stream = lambda _device: sd.current_stream().key[1]  # noqa: E731
    if use_native:
        return native.trace_hook.Deliver(hub, False, device, raw_stream), native.trace_hook.Deliver(hub, True, device,
                                                                                                      raw_stream)
    allocated, freed = hub.direct("on_trace_alloc"), hub.direct("on_trace_free")
    return (lambda ptr: allocated(ptr, device())), freed


def run_program(seed: int, use_native: bool) -> list:
    """Random traced allocations, accesses and frees of four storages over
    three streams; the findings as comparable text."""
    rng = random.Random(seed)
    tensors = [torch.ones(16) for _ in range(4)]  # made before the sanitizer: the trace allocates them
    parts = native.native_parts() if use_native else native.python_parts()
    san = LifetimeSanitizer("sim", on_race="collect", warn_on_free=False, parts=parts)
    with san:
        allocated, freed = _subscribers(san, use_native)
        streams = [sd.default_stream(), sd.Stream(), sd.Stream()]
        live = set()
        for _ in range(30):
            kind, s, t = rng.choice(["alloc", "free", "read", "write", "wait"]), rng.randrange(3), rng.randrange(4)
            ptr = tensors[t].data_ptr()
            with sd.stream(streams[s]):
                if kind == "alloc":
                    allocated(ptr)
                    live.add(t)
                elif kind == "free" and t in live:
                    freed(ptr)
                    live.discard(t)
                elif kind == "read" and t in live:
                    tensors[t].sum()
                elif kind == "write" and t in live:
                    tensors[t].add_(1)
                elif kind == "wait":
                    streams[s].wait_stream(streams[(s + 1) % 3])
        for t in live:
            freed(tensors[t].data_ptr())
    del tensors
    gc.collect()
    return sorted(f"{f.kind}: {san.report([f]).splitlines()[0]}" for f in san.flush())


@pytest.mark.parametrize("seed", range(30))
def test_the_native_trace_path_finds_what_the_python_path_finds(seed):
    assert run_program(seed, True) == run_program(seed, False)


def test_the_programs_make_findings_through_the_trace():
    """The comparison compares something: traced storages get uncovered
    frees and races, and the native path sized them at their first access."""
    kinds = set()
    for seed in range(30):
        kinds.update(line.split(":")[0] for line in run_program(seed, True))
    assert "uncovered_free" in kinds and ("data_race" in kinds or "reuse_race" in kinds), kinds


def test_a_trace_allocation_goes_to_the_model_in_c():
    """The native subscriber reaches the storage feed, not on_trace_alloc."""
    t = torch.ones(8)
    san = LifetimeSanitizer("sim", on_race="collect", warn_on_free=False)
    san.on_trace_alloc = san.on_trace_free = None  # the Python entries would fail if called
    san._trace_alloc = san._trace_free = None
    with san:
        allocated, freed = _subscribers(san, True)
        allocated(t.data_ptr())
        sid = san.storages.get(t.data_ptr())
        assert sid is not None and sid in san.storages.sizeless
        t.add_(1)  # its size learnt at its first access
        assert sid not in san.storages.sizeless
        freed(t.data_ptr())
        assert san.storages.get(t.data_ptr()) is None


def test_the_shim_connected_skips_the_trace():
    t = torch.ones(8)
    san = LifetimeSanitizer("sim", on_race="collect", warn_on_free=False)
    with san:
        allocated, _ = _subscribers(san, True)
        san._shim.connected = True
        try:
            allocated(t.data_ptr())
        finally:
            san._shim.connected = False
        assert san.storages.get(t.data_ptr()) is None


class _TracedSimulation:
    """What a trace delivery's ``memory_subscribers`` reads of a backend, on the simulated device."""

    def __init__(self, hub) -> None:
        self.hub = hub

    @staticmethod
    def current_device() -> int:
        return sd.DEVICE_INDEX

    @staticmethod
    def _raw_stream_calls() -> tuple:
        return (lambda: sd.DEVICE_INDEX), (lambda _device: sd.current_stream().key[1])


@pytest.mark.usefixtures("both_ways")  # conftest.py: _trace_hook.c's subscribers, then backends.TraceDelivery's
def test_a_traced_free_before_another_streams_use_finished_is_found_at_the_free():
    """The subscribers a CUDA or NPU backend registers (whichever its parts
    choose) tell the sanitizer of a storage only the trace knows, and the
    free's uncovered use reaches the findings, with its warning, at the free."""
    x = torch.ones(16)  # made before the sanitizer: only the trace tells it of x
    san = LifetimeSanitizer("sim", on_race="collect")
    with san:
        delivery = native.default().trace_delivery  # the parts both_ways chose
        allocated, freed = delivery.memory_subscribers(_TracedSimulation(san.backend.hub))
        allocated(x.data_ptr())
        side = sd.Stream()
        side.wait_stream(sd.current_stream())
        with sd.stream(side):
            x.sum()
        with pytest.warns(LifetimeWarning, match="uncovered"):
            freed(x.data_ptr())
        assert san.storages.get(x.data_ptr()) is None
    assert [f.kind for f in san.flush()] == ["uncovered_free"]


def test_fire_calls_its_one_subscriber_and_defers_to_the_registry_for_more():
    registry = CallbackRegistry("test")
    calls = []
    ours = lambda ptr: calls.append(("ours", ptr))  # noqa: E731
    registry.add_callback(ours)
    registry.fire_callbacks = native.trace_hook.Fire(registry.callback_list, ours, registry.fire_callbacks)
    registry.fire_callbacks(1)
    assert calls == [("ours", 1)]
    registry.add_callback(lambda ptr: calls.append(("csan", ptr)))
    registry.fire_callbacks(2)
    assert calls == [("ours", 1), ("ours", 2), ("csan", 2)]


def test_fire_does_not_raise_into_torch():
    registry = CallbackRegistry("test")

    def failing(ptr):
        raise RuntimeError("boom")

    registry.add_callback(failing)
    registry.fire_callbacks = native.trace_hook.Fire(registry.callback_list, failing, registry.fire_callbacks)
    seen = []
    import sys

    hook, sys.unraisablehook = sys.unraisablehook, lambda u: seen.append(u.exc_value)
    try:
        registry.fire_callbacks(3)
    finally:
        sys.unraisablehook = hook
    assert len(seen) == 1 and str(seen[0]) == "boom"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA allocation trace needs a GPU")
def test_on_cuda_the_sanitizer_and_another_trace_subscriber_both_see_an_allocation():
    """Fire replaced torch's fire_callbacks: a subscriber registered after
    ours (CSAN's, here a counter) still gets every allocation and free."""
    from torch.cuda import _gpu_trace

    san = LifetimeSanitizer("cuda", on_race="collect", warn_on_free=False)
    with san:
        assert isinstance(_gpu_trace.MemoryAllocationCallbacks.fire_callbacks, native.trace_hook.Fire)
        t = torch.empty(1 << 20, device="cuda")
        assert san.storages.get(t.untyped_storage().data_ptr()) is not None  # ours, the one subscriber
        seen = []
        _gpu_trace.register_callback_for_memory_allocation(lambda ptr: seen.append(("alloc", ptr)))
        _gpu_trace.register_callback_for_memory_deallocation(lambda ptr: seen.append(("free", ptr)))
        try:
            u = torch.empty(1 << 20, device="cuda")
            address = u.untyped_storage().data_ptr()
            assert san.storages.get(address) is not None and ("alloc", address) in seen
            del u
            assert san.storages.get(address) is None and ("free", address) in seen
        finally:
            _gpu_trace.MemoryAllocationCallbacks.callback_list.pop()
            _gpu_trace.MemoryDeallocationCallbacks.callback_list.pop()
