"""The GPU trace bridge (allocator_shim/torch_bridge/gpu_trace_bridge.cpp,
npu_lifetime/sanitizer/trace_bridge.py) delivers each traced event as
torch's own interpreter does: the same registry's fire_callbacks, the same
arguments, in the same order, errors reported and never raised; device
types that are not CUDA stay torch's.

The reference is torch's interpreter itself: each event is fired through
the trace's current interpreter (the bridge) and through torch's, as
torch's C++ fires it (without the GIL), and what the subscribers saw is
compared.  On CPU nothing of torch's fires the trace, so these tests fire
it; on a GPU the sanitizer's own tests run through the bridge, and the last
test here checks that CSAN, enabled after it, still finds a race.  Not
checked on CPU: the TLS guard, and the interpreter's shutdown (the
Py_IsInitialized check), which torch's own path shares."""
import subprocess
import sys
import textwrap
import threading
import types

import pytest
import torch
from torch._utils import CallbackRegistry
from torch.cuda import _gpu_trace

from npu_lifetime.sanitizer import native, trace_bridge
from npu_lifetime.shim import bridge

PATHS = ("through the bridge", "through torch's interpreter")


def _registry_name(kind: str) -> str:
    return "".join(word.capitalize() for word in kind.split("_")) + "Callbacks"


@pytest.fixture(scope="module")
def installed():
    if not trace_bridge.wanted():
        pytest.skip("the GPU trace bridge is turned off (NPU_LIFETIME_NATIVE=0 or NPU_LIFETIME_TRACE_BRIDGE=0)")
    try:
        bridge.build(name=bridge.GPU_TRACE_BRIDGE)
    except bridge.BridgeUnavailable as error:
        pytest.skip(f"the GPU trace bridge cannot be built here: {error}")
    torch._C._activate_gpu_trace()
    assert trace_bridge.install() and trace_bridge.installed()


def _subscribe_only(monkeypatch, registry, subscribers: list) -> None:
    """For this test, ``registry`` serves ``subscribers`` alone with torch's
    own fire_callbacks: after a CUDA sanitizer ran in this process, its
    _trace_hook.Fire stays the registry's fire_callbacks, calling the
    sanitizer's subscriber (a hub with no sinks now) from its own list."""
    monkeypatch.setattr(registry, "callback_list", subscribers)
    if "fire_callbacks" in vars(registry):
        monkeypatch.delattr(registry, "fire_callbacks")


@pytest.fixture
def recorded(installed, monkeypatch):
    """Every registry's subscribers replaced by [a recorder]; the calls it saw."""
    calls = []
    for kind in trace_bridge.KINDS:
        registry = getattr(_gpu_trace, _registry_name(kind))
        _subscribe_only(monkeypatch, registry, [lambda *args, kind=kind: calls.append((kind, *args))])
    return calls


def _fire_every_kind(through_torch: bool, device_type: int = trace_bridge.CUDA) -> None:
    for n, kind in enumerate(trace_bridge.KINDS):
        trace_bridge.fire(kind, 1000 + n, 2**63 + n, device_type=device_type, through_torch=through_torch)


def test_every_kind_reaches_its_registry_with_torchs_arguments(recorded):
    seen = {}
    for path, through_torch in zip(PATHS, (False, True)):
        _fire_every_kind(through_torch)
        seen[path], recorded[:] = list(recorded), []
    assert seen[PATHS[0]] == seen[PATHS[1]]
    assert [call[0] for call in seen[PATHS[0]]] == list(trace_bridge.KINDS)
    assert ("event_record", 1002, 2**63 + 2) in seen[PATHS[0]]  # two arguments, the second past 63 bits
    assert ("device_synchronization",) in seen[PATHS[0]]  # no argument


def test_hip_is_delivered_to_torch_cuda_as_torch_does(recorded):
    seen = {}
    for path, through_torch in zip(PATHS, (False, True)):
        _fire_every_kind(through_torch, device_type=trace_bridge.HIP)
        seen[path], recorded[:] = list(recorded), []
    assert seen[PATHS[0]] == seen[PATHS[1]] and len(seen[PATHS[0]]) == len(trace_bridge.KINDS)


@pytest.mark.parametrize("kind", trace_bridge.KINDS)
def test_another_device_type_stays_torchs(installed, monkeypatch, kind):
    """An XPU event goes to torch's interpreter, which finds torch.xpu's
    registries (also after a second install, which must not take the bridge
    for torch's and recurse)."""
    import torch.xpu

    registries = {k: CallbackRegistry(k) for k in trace_bridge.KINDS}
    calls = []
    for k, registry in registries.items():
        registry.add_callback(lambda *args, k=k: calls.append((k, *args)))
    monkeypatch.setattr(torch.xpu, "_gpu_trace", types.SimpleNamespace(
        **{_registry_name(k): registry for k, registry in registries.items()}), raising=False)
    assert trace_bridge.install()  # already installed: nothing changes
    trace_bridge.fire(kind, 7, 8, device_type=trace_bridge.XPU)
    trace_bridge.fire(kind, 7, 8, device_type=trace_bridge.XPU, through_torch=True)
    assert len(calls) == 2 and calls[0] == calls[1] and calls[0][0] == kind


@pytest.mark.parametrize("device_type", [trace_bridge.CUDA, trace_bridge.HIP])
def test_the_bridge_does_not_import_torch_cuda_at_each_event(recorded, monkeypatch, device_type):
    """torch's interpreter imports "torch.cuda" at every event, for HIP too
    (it finds a decoy put in sys.modules); the bridge uses the module it holds."""
    decoy_calls = []
    decoy = types.ModuleType("torch.cuda")
    decoy._gpu_trace = types.SimpleNamespace(MemoryAllocationCallbacks=types.SimpleNamespace(
        fire_callbacks=lambda ptr: decoy_calls.append(ptr)))
    monkeypatch.setitem(sys.modules, "torch.cuda", decoy)
    trace_bridge.fire("memory_allocation", 21, device_type=device_type)
    trace_bridge.fire("memory_allocation", 22, device_type=device_type, through_torch=True)
    assert recorded == [("memory_allocation", 21)] and decoy_calls == [22]


def test_no_reference_is_kept_or_dropped(installed, monkeypatch):
    """100 events leave every object's reference count as it was."""
    registry, kept, result = _gpu_trace.EventRecordCallbacks, [], object()

    class Fire:  # an instance attribute: the lookup returns this object itself
        def __call__(self, *args):
            kept.append(args)
            return result

    fire = Fire()
    monkeypatch.setattr(registry, "fire_callbacks", fire)
    watched = (fire, result, registry, _gpu_trace, torch.cuda)
    before = [sys.getrefcount(o) for o in watched]
    for i in range(100):
        trace_bridge.fire("event_record", 1000 + i, 2**63 + i)
    assert [sys.getrefcount(o) for o in watched] == before
    assert len(kept) == 100 and all(sys.getrefcount(a) == sys.getrefcount(b) == 3 for a, b in kept)


def test_several_subscribers_in_order_and_one_that_raises_stops_nobody(installed, monkeypatch):
    registry = _gpu_trace.MemoryDeallocationCallbacks
    calls = []

    def failing(ptr):
        calls.append(("first", ptr))
        raise ValueError("a subscriber's bug")

    _subscribe_only(monkeypatch, registry, [failing, lambda ptr: calls.append(("second", ptr))])
    for through_torch in (False, True):
        trace_bridge.fire("memory_deallocation", 5, through_torch=through_torch)
    assert calls == [("first", 5), ("second", 5)] * 2


def test_the_registry_is_looked_up_at_each_event(installed, monkeypatch):
    """As torch's: a registry put in the module's place later is the one served."""
    replacement, calls = CallbackRegistry("replacement"), []
    replacement.add_callback(calls.append)
    monkeypatch.setattr(_gpu_trace, "EventCreationCallbacks", replacement)
    trace_bridge.fire("event_creation", 3)
    monkeypatch.setattr(replacement, "fire_callbacks", lambda ptr: calls.append(("patched", ptr)))
    trace_bridge.fire("event_creation", 4)
    assert calls == [3, ("patched", 4)]


def test_an_error_of_fire_callbacks_is_reported_not_raised(installed, monkeypatch):
    def broken(ptr):
        raise RuntimeError(f"broken at {ptr}")

    reported = []
    monkeypatch.setattr(sys, "unraisablehook", lambda info: reported.append(info.exc_value))
    monkeypatch.setattr(_gpu_trace.MemoryAllocationCallbacks, "fire_callbacks", broken)
    trace_bridge.fire("memory_allocation", 9)  # returns: torch's allocator never sees it
    assert [str(error) for error in reported] == ["broken at 9"]


def test_the_sanitizers_fire_shortcut_is_served(installed, monkeypatch):
    """_trace_hook.Fire, the registry's fire_callbacks while the sanitizer is
    its one subscriber, is what the bridge calls."""
    if native.trace_hook is None:
        pytest.skip("_trace_hook is not built")
    registry, calls = _gpu_trace.StreamSynchronizationCallbacks, []
    only = calls.append
    _subscribe_only(monkeypatch, registry, [only])
    monkeypatch.setattr(registry, "fire_callbacks",
                        native.trace_hook.Fire(registry.callback_list, only, registry.fire_callbacks))
    trace_bridge.fire("stream_synchronization", 12)
    assert calls == [12]


def test_a_subscriber_added_after_the_sanitizer_left_is_served(installed, monkeypatch):
    """After a CUDA sanitizer, its Fire stays the registry's fire_callbacks
    and its subscriber stays registered (idle); CSAN enabled later adds its
    own: Fire then defers to torch's fire_callbacks, which calls both."""
    if native.trace_hook is None:
        pytest.skip("_trace_hook is not built")
    registry, idle, later = _gpu_trace.MemoryAllocationCallbacks, [], []
    _subscribe_only(monkeypatch, registry, [idle.append])
    monkeypatch.setattr(registry, "fire_callbacks",
                        native.trace_hook.Fire(registry.callback_list, idle.append, registry.fire_callbacks))
    registry.add_callback(later.append)
    trace_bridge.fire("memory_allocation", 31)
    assert idle == [31] and later == [31]


def test_events_fired_from_many_threads_at_once_all_arrive(installed, monkeypatch):
    calls = []
    _subscribe_only(monkeypatch, _gpu_trace.MemoryAllocationCallbacks, [calls.append])

    def fire_many(base):
        for i in range(2000):
            trace_bridge.fire("memory_allocation", base + i)

    threads = [threading.Thread(target=fire_many, args=(n * 10_000,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(calls) == sorted(n * 10_000 + i for n in range(4) for i in range(2000))


def _fresh(code: str, **env) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=300)


def test_install_needs_torchs_trace_and_is_idempotent(installed):
    done = _fresh("""
        import torch
        from npu_lifetime.sanitizer import trace_bridge
        try:
            trace_bridge.install()
        except RuntimeError as error:
            print("refused:", error)
        torch._C._activate_gpu_trace()
        print(trace_bridge.install(), trace_bridge.install(), trace_bridge.installed())
    """)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("refused:") and "_activate_gpu_trace" in lines[0]
    assert lines[1] == "True True True"


def test_a_second_copy_of_the_library_leaves_the_installed_one_alone(installed, tmp_path):
    """Installed only over torch's own interpreter: another copy (another
    cache) finds the first one there and stays out."""
    import ctypes

    copy = ctypes.PyDLL(str(bridge.build(tmp_path, name=bridge.GPU_TRACE_BRIDGE)))
    copy.npl_trace_bridge_install.argtypes = [ctypes.py_object]
    assert copy.npl_trace_bridge_install(torch.cuda) == trace_bridge.LEFT_OUT
    assert trace_bridge.installed()


@pytest.mark.parametrize("env", [{"NPU_LIFETIME_TRACE_BRIDGE": "0"}, {"NPU_LIFETIME_NATIVE": "0"}])
def test_turned_off_it_is_never_installed(env):
    done = _fresh("""
        import torch
        from npu_lifetime.sanitizer import native, trace_bridge
        torch._C._activate_gpu_trace()
        print(trace_bridge.install(), trace_bridge.installed(), native.in_use()["trace_bridge"])
    """, **env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False", "False"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA's own trace needs a GPU")
def test_on_cuda_csan_enabled_after_the_sanitizer_still_finds_its_race(installed):
    """In a fresh process: our sanitizer installs the bridge; CSAN, enabled
    after it (its activation is then a no-op), is served by the bridge and
    reports an unsynchronised write."""
    done = _fresh("""
        import torch
        from npu_lifetime.sanitizer import LifetimeSanitizer, trace_bridge
        with LifetimeSanitizer("cuda", on_race="collect"):
            assert trace_bridge.installed()
        from torch.cuda._sanitizer import CUDASanitizerErrors, enable_cuda_sanitizer
        enable_cuda_sanitizer()
        a = torch.ones(1 << 10, device="cuda")
        side = torch.cuda.Stream()
        try:
            with torch.cuda.stream(side):
                a.add_(1)
            a.mul_(2)
            torch.cuda.synchronize()
        except CUDASanitizerErrors as errors:
            print("CSAN found:", len(errors.errors))
    """)
    assert done.returncode == 0, done.stderr
    assert "CSAN found: 1" in done.stdout, done.stdout + done.stderr
