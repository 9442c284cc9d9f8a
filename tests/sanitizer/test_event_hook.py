"""Device events delivered by _event_hook.c's Event (Hub.subscriber) reach
the sinks, or the op in progress, exactly as Hub.event's Python delivery
does: the same calls in the same order, and the same findings on traced
event programs, delivered through a torch callback registry as CUDA's trace
delivers them (with Fire's shortcut)."""
import gc
import random
import re

import pytest
import torch
from torch._utils import CallbackRegistry

from npu_lifetime import simdevice as sd
from npu_lifetime.sanitizer import LifetimeSanitizer, native
from npu_lifetime.sanitizer.backends import _SIM_EVENTS, _SimListener
from npu_lifetime.sanitizer.hub import DEVICE_ONLY, HELD, KEEP_ARGS, KEY_LAST, Hub, OpFrame, on_thread

from helpers.by_chance import not_by_chance

if native.event_hook is None:
    pytest.skip("the sanitizer's native event hook is off or not built", allow_module_level=True)

# the CUDA trace's device events: (trace kind, the sinks' method, keying, number of trace arguments)
TRACE_EVENTS = [("event_creation", "on_event_created", KEEP_ARGS, 1),
                ("event_deletion", "on_event_deleted", KEEP_ARGS, 1),
                ("event_record", "on_event_record", KEY_LAST, 2),
                ("event_wait", "on_event_wait", KEY_LAST, 2),
                ("stream_creation", "on_stream_created", KEY_LAST, 1),
                ("device_synchronization", "on_device_sync", DEVICE_ONLY, 0),
                ("stream_synchronization", "on_stream_sync", KEY_LAST, 1),
                ("event_synchronization", "on_event_sync", KEEP_ARGS, 1),
                ("record_stream", "on_record_stream_ptr", KEY_LAST, 2)]  # NPU's; never held


def _subscriber(hub: Hub, name: str, keying: int, use_native: bool, device=lambda: 3):
    """``Parts.event_subscriber``: C's, or Python's (``Hub.subscriber``)."""
    parts = native.native_parts() if use_native else native.python_parts()
    return parts.event_subscriber(hub, name, device, keying)


@pytest.fixture(params=[True, False], ids=["native", "python"])
def subscriber(request):
    """``subscriber(hub, name, device=None, keying=KEEP_ARGS)``, C's or Python's."""
    return lambda hub, name, device=None, keying=KEEP_ARGS: _subscriber(hub, name, keying, request.param, device)


class _Recorder:
    """A sink that logs each device event it gets."""

    def __init__(self, tag, log) -> None:
        self.tag, self.log = tag, log

    def __getattr__(self, name):
        if not name.startswith("on_"):
            raise AttributeError(name)
        return lambda *args: self.log.append((self.tag, name, args))


def delivery_log(seed: int, use_native: bool) -> list:
    """Random device events, some inside an op, to two sinks: what each
    sink got and what the op's frame held, in order."""
    rng = random.Random(seed)
    log: list = []
    hub = Hub()
    hub.add(_Recorder("a", log))
    hub.add(_Recorder("b", log))
    fire = {name: _subscriber(hub, name, keying, use_native) for _, name, keying, _ in TRACE_EVENTS}
    arity = {name: n for _, name, _, n in TRACE_EVENTS}
    try:
        for _ in range(60):
            name = rng.choice(sorted(fire))
            on_thread.frame = OpFrame("site") if rng.random() < 0.4 else None
            fire[name](*(rng.randrange(100) for _ in range(arity[name])))
            if on_thread.frame is not None:
                log.extend(("held", *entry[1:]) for entry in on_thread.frame.held)
                assert all(entry[0] is hub for entry in on_thread.frame.held)
    finally:
        on_thread.frame = None
    return log


@pytest.mark.parametrize("seed", range(20))
def test_each_event_reaches_the_sinks_or_the_frame_in_order(seed):
    got = delivery_log(seed, True)
    assert got == delivery_log(seed, False)
    held = {name for tag, name, _ in got if tag == "held"}
    assert held and held <= HELD and any(tag == "a" for tag, _, _ in got)  # both ways were taken
    assert ("held", "on_record_stream_ptr") not in {(tag, name) for tag, name, _ in got}


def test_the_keys_are_made_from_the_device(subscriber):
    log: list = []
    hub = Hub()
    hub.add(_Recorder("a", log))
    subscriber(hub, "on_event_record", lambda: 5, KEY_LAST)(7, 0x10)
    subscriber(hub, "on_device_sync", lambda: 5, DEVICE_ONLY)()
    subscriber(hub, "on_event_created", None, KEEP_ARGS)(7)
    assert log == [("a", "on_event_record", (7, (5, 0x10))), ("a", "on_device_sync", (5,)),
                   ("a", "on_event_created", (7,))]


def test_no_sink_no_delivery_and_errors_reach_the_caller(subscriber):
    hub = Hub()
    called = []
    subscriber(hub, "on_device_sync", lambda: called.append(1), DEVICE_ONLY)()
    assert called == []  # no sink: not even the device asked

    class Failing:
        def on_event_created(self, event):
            raise RuntimeError("sink failed")

    hub.add(Failing())
    with pytest.raises(RuntimeError, match="sink failed"):
        subscriber(hub, "on_event_created")(1)
    with pytest.raises(TypeError):
        subscriber(hub, "on_event_record", lambda: 0, KEY_LAST)()  # no stream handle


# -- findings on traced event programs ------------------------------------------------------------------

def _sim_listener() -> _SimListener:
    found = [listener for listener in sd._listeners if isinstance(listener, _SimListener)]
    assert len(found) == 1
    return found[0]


def _registries(hub: Hub, use_native: bool, drop: str = "") -> dict:
    """Trace kind -> a torch callback registry with our subscriber, fired
    through Fire as on CUDA; ``drop``: an event kind that never arrives."""
    registries = {}
    for kind, name, keying, _ in TRACE_EVENTS:
        registry = CallbackRegistry(kind)
        subscriber = _subscriber(hub, name, keying, use_native, device=lambda: sd.DEVICE_INDEX)
        registry.add_callback((lambda *args: None) if kind == drop else subscriber)
        registry.fire_callbacks = native.trace_hook.Fire(registry.callback_list, registry.callback_list[0],
                                                         registry.fire_callbacks)
        registries[kind] = registry
    return registries


KINDS = ["read", "write", "item", "free", "record", "wait", "create", "delete", "event_sync", "stream_sync",
         "device_sync"]


def random_steps(seed: int) -> list:
    """(kind, stream index, tensor index, event) steps."""
    rng = random.Random(seed)
    return [(rng.choice(KINDS), rng.randrange(3), rng.randrange(4), 1000 + rng.randrange(3)) for _ in range(40)]


def run_program(steps: list, use_native: bool, drop: str = "") -> list:
    """Ops on three streams ordered by traced events (and the simulated
    device's own, from its listener: host syncs inside ``.item()`` held by
    the op's frame); the findings as comparable text."""
    san = LifetimeSanitizer("sim", on_race="collect", warn_on_free=False)
    san.backend.connect(native.default())  # the simulated device's listener, made once per process
    listener = _sim_listener()
    assert isinstance(listener.on_event_record, native.event_hook.Event)
    made = vars(listener).copy()
    if not use_native:
        for name in _SIM_EVENTS:
            setattr(listener, name, san.backend.hub.subscriber(name, None, KEEP_ARGS))
    try:
        with san:
            fire = {kind: r.fire_callbacks for kind, r in _registries(san.backend.hub, use_native, drop).items()}
            streams = [sd.default_stream(), sd.Stream(), sd.Stream()]
            handles = [s.key[1] for s in streams]
            tensors = [torch.ones(16) for _ in range(4)]
            for kind, s, t, e in steps:
                with sd.stream(streams[s]):
                    if kind == "read":
                        tensors[t].sum()
                    elif kind == "write":
                        tensors[t].add_(1)
                    elif kind == "item":
                        tensors[t].sum().item()
                    elif kind == "free":
                        tensors[t] = tensors[(t + 1) % 4] * 2
                    elif kind == "record":
                        fire["event_record"](e, handles[s])
                    elif kind == "wait":
                        fire["event_wait"](e, handles[s])
                    elif kind == "create":
                        fire["event_creation"](e)
                    elif kind == "delete":
                        fire["event_deletion"](e)
                    elif kind == "event_sync":
                        fire["event_synchronization"](e)
                    elif kind == "stream_sync":
                        fire["stream_synchronization"](handles[s])
                    else:
                        fire["device_synchronization"]()
            del tensors
            gc.collect()
    finally:
        vars(listener).update(made)
    return sorted(_comparable(repr(f), handles) for f in san.flush())


def _comparable(text: str, handles: list) -> str:
    """A finding's repr with the streams by their index in the program, and
    no addresses (the host's malloc chooses them)."""
    for index, handle in enumerate(handles):
        text = text.replace(f"({sd.DEVICE_INDEX}, {handle})", f"stream#{index}")
    return re.sub(r"address=\d+|0x[0-9a-f]+", "", text)


@pytest.mark.parametrize("seed", range(25))
def test_traced_event_programs_get_the_same_findings_both_ways(seed):
    steps = random_steps(seed)
    assert not_by_chance(run_program(steps, True)) == not_by_chance(run_program(steps, False))


def test_the_random_programs_make_findings():
    assert sum(bool(not_by_chance(run_program(random_steps(seed), True))) for seed in range(10)) >= 5


# a write on stream 1 ordered before the default stream's read by an event, then a host sync
ORDERED = [("create", 1, 0, 1000), ("write", 1, 0, 0), ("record", 1, 0, 1000), ("wait", 0, 0, 1000),
           ("read", 0, 0, 0), ("write", 2, 1, 0), ("event_sync", 0, 0, 1000), ("stream_sync", 2, 0, 0),
           ("read", 0, 1, 0), ("free", 0, 0, 0), ("free", 0, 1, 0)]


@pytest.mark.parametrize("dropped", ["event_record", "event_wait", "stream_synchronization"])
def test_a_dropped_event_changes_the_findings(dropped):
    """The comparison sees a path that drops an event."""
    right = run_program(ORDERED, True)
    assert right == run_program(ORDERED, False)
    assert run_program(ORDERED, True, drop=dropped) != right


class _LoggingSink:
    def __init__(self) -> None:
        self.log: list = []

    def __getattr__(self, name: str):
        if not name.startswith("on_"):
            raise AttributeError(name)
        return lambda *args: self.log.append((name, args))


@pytest.mark.parametrize("use_native", [True, False], ids=["native", "python"])
def test_a_trace_backend_registers_its_parts_deliveries(use_native):
    """CUDA's registration (``_register_trace``, run on CPU with a stand-in
    device and stream): the parts' subscribers, keyed alike, and the parts'
    shortcut of torch's loop (C's ``Fire``; Python's leaves torch's)."""
    from npu_lifetime.sanitizer.backends import CudaBackend

    parts = native.native_parts() if use_native else native.python_parts()
    backend = CudaBackend()
    backend._raw_stream_calls = lambda: ((lambda: 2), (lambda device: 0x77))
    registered: dict = {}
    backend._register_trace(registered.__setitem__, parts)
    sink = _LoggingSink()
    backend.hub.add(sink)
    registered["event_record"](5, 0x10)
    registered["device_synchronization"]()
    registry = CallbackRegistry("event_creation")
    registry.add_callback(registered["event_creation"])
    parts.trace_delivery.shortcut(registry, registered["event_creation"])
    registry.fire_callbacks(9)
    assert len(registered) == 10
    assert sink.log == [("on_event_record", (5, (2, 0x10))), ("on_device_sync", (2,)), ("on_event_created", (9,))]
    assert isinstance(registry.fire_callbacks, native.trace_hook.Fire) == use_native
    assert isinstance(registered["event_record"], native.event_hook.Event) == use_native
