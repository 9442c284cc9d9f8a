"""The sanitizer's device-event handlers in C (_event_feed.c) against their
Python bodies (sanitizer.py's on_event_* / on_wait_stream / on_*_sync):
the same model calls with the same arguments in the same order, on random
event sequences; the same reports on programs whose findings name where the
host waited or where an unrecorded event was waited on; errors raised with
the lock released."""
import gc
import random
import threading

import pytest
import torch

from npu_lifetime import simdevice as sd
from npu_lifetime.sanitizer import LifetimeSanitizer, native

if native.event_feed is None:
    pytest.skip("the sanitizer's native event feed is off or not built", allow_module_level=True)

HANDLERS = LifetimeSanitizer._NATIVE_EVENT_HANDLERS


class _LoggingModel:
    """Stands in for the lifetime model: logs each call; an event counts as
    recorded once record_event named it; a wait on event 'found' finds one."""

    def __init__(self, log: list) -> None:
        self.log, self.streams, self.recorded = log, set(), set()

    def _logged(self, name, *args):
        self.log.append((name, tuple(_plain(a) for a in args)))

    def has_stream(self, key):
        return key in self.streams

    def create_stream(self, key, device=0):
        self._logged("create_stream", key, device)
        self.streams.add(key)

    def create_event(self, event):
        self._logged("create_event", event)

    def delete_event(self, event):
        self._logged("delete_event", event)
        self.recorded.discard(event)

    def record_event(self, event, key):
        self._logged("record_event", event, key)
        self.recorded.add(event)

    def event_recorded(self, event):
        return event in self.recorded

    def wait_event(self, key, event, site=None):
        self._logged("wait_event", key, event, site)
        return ["a finding"] if event == "found" else []

    def wait_stream(self, waiter, waitee):
        self._logged("wait_stream", waiter, waitee)

    def synchronize_stream(self, key, site=None):
        self._logged("synchronize_stream", key, site() if callable(site) else site)

    def synchronize_device(self, device, site=None):
        self._logged("synchronize_device", device, site() if callable(site) else site)


def _plain(value):
    """A site as the line it names (the two paths capture it from different frames of this file)."""
    if value is None or isinstance(value, (int, str, tuple)):
        return value
    if not getattr(value, "frames", None):
        return f"site:{value}"
    code, line = value.frames[0]
    return f"site:{code.co_name}:{line}"


def _sanitizer(log: list, use_native: bool) -> LifetimeSanitizer:
    san = LifetimeSanitizer("sim")
    san.model = _LoggingModel(log)
    san._keep = lambda found: found and log.append(("keep", tuple(found)))  # _keep: nothing for no findings
    for name in HANDLERS:  # the class's Python bodies ...
        san.__dict__.pop(name, None)
    if use_native:  # ... or the C handlers over the logging model
        san._use_native_event_feed()
        assert all(type(getattr(san, name)).__name__ == "builtin_function_or_method" for name in HANDLERS)
    return san


def _random_events(seed: int) -> list:
    rng = random.Random(seed)
    events, keys = ["e1", "e2", "e3", "found"], [(0, 0), (0, 1), (0, 2)]
    calls = []
    for _ in range(30):
        name = rng.choice(HANDLERS)
        if name in ("on_event_created", "on_event_deleted"):
            calls.append((name, (rng.choice(events),)))
        elif name in ("on_event_record", "on_event_wait"):
            calls.append((name, (rng.choice(events), rng.choice(keys))))
        elif name == "on_wait_stream":
            calls.append((name, (rng.choice(keys), rng.choice(keys))))
        elif name == "on_stream_sync":
            calls.append((name, (rng.choice(keys),)))
        else:
            calls.append((name, (0,)))
    return calls


def _run(calls: list, use_native: bool) -> list:
    log: list = []
    san = _sanitizer(log, use_native)
    for name, args in calls:
        log.append(("call", name))
        getattr(san, name)(*args)  # one line: both paths' sites name it
    log.append(("known", tuple(sorted(san._known_events))))
    return log


@pytest.mark.parametrize("seed", range(25))
def test_each_handler_makes_the_model_calls_its_python_body_makes(seed):
    calls = _random_events(seed)
    native_log = _run(calls, use_native=True)
    assert native_log == _run(calls, use_native=False)
    assert any(entry[0] == "wait_event" for entry in native_log) or seed  # waits happen (seed 0 at least)


def test_an_unrecorded_wait_and_a_found_one_go_where_the_python_body_sends_them():
    calls = [("on_event_created", ("e1",)), ("on_event_wait", ("e1", (0, 1))),  # unrecorded: a site captured
             ("on_event_record", ("found", (0, 0))), ("on_event_wait", ("found", (0, 1))),  # kept
             ("on_event_wait", ("unknown", (0, 2))),  # created before enable(): nothing
             ("on_stream_sync", ((0, 0),)), ("on_device_sync", (0,))]
    native_log = _run(calls, use_native=True)
    assert native_log == _run(calls, use_native=False)
    waits = [entry for entry in native_log if entry[0] == "wait_event"]
    assert waits[0][1][:2] == ((0, 1), "e1") and waits[0][1][2].startswith("site:")  # the unrecorded wait's site
    assert waits[1][1] == ((0, 1), "found", None)
    assert ("keep", ("a finding",)) in native_log
    syncs = [entry for entry in native_log if entry[0].startswith("synchronize")]
    assert all(entry[1][1].startswith("site:") for entry in syncs)


def _host_wait_report(monkeypatch, use_native: bool) -> str:
    if not use_native:
        monkeypatch.setattr(native, "event_feed", None)
    san = LifetimeSanitizer("sim", on_race="warn", warn_on_free=False)
    with san:
        side = sd.Stream()
        x = torch.ones(64)
        with sd.stream(side):
            y = x + 1
        del x
        gc.collect()
        side.synchronize()  # the host waits past the use: the latent free's reason names this line
        del y
        gc.collect()
    return san.report(san.flush())


def test_a_latent_free_names_the_line_where_the_host_waited_on_both_paths(monkeypatch):
    with pytest.warns(Warning):
        native_report = _host_wait_report(monkeypatch, use_native=True)
    with pytest.warns(Warning):
        python_report = _host_wait_report(monkeypatch, use_native=False)
    line = next(n for n, text in enumerate(open(__file__), 1) if "side.synchronize()  # the host waits" in text)
    where = f"host waited past the use at {__file__}:{line} in _host_wait_report"
    waited = [[text for text in report.splitlines() if "host waited" in text] for report in (native_report, python_report)]
    assert waited[0] == waited[1] and len(waited[0]) == 1 and where in waited[0][0]


def test_a_failing_model_call_raises_with_the_lock_released():
    log: list = []
    san = _sanitizer(log, use_native=True)

    def broken(*args):
        raise KeyError("the model failed")

    san.model.record_event = broken
    san._use_native_event_feed()  # looks the model's methods up again
    with pytest.raises(KeyError, match="the model failed"):
        san.on_event_record("e1", (0, 0))
    taken = []
    other = threading.Thread(target=lambda: taken.append(san._lock.acquire(timeout=5) and san._lock.release()))
    other.start()
    other.join()
    assert taken == [None]  # another thread could take the lock: the C handler released it


@pytest.mark.parametrize("name, args", [("on_event_record", ("e1",)), ("on_event_wait", ("e1", (0, 0), 3)),
                                        ("on_wait_stream", ((0, 0),))])
def test_a_handler_called_with_the_wrong_arguments_says_so(name, args):
    san = _sanitizer([], use_native=True)
    with pytest.raises(TypeError, match=name):
        getattr(san, name)(*args)


def test_the_feed_refuses_a_model_without_the_methods_it_calls():
    san = LifetimeSanitizer("sim")
    with pytest.raises(AttributeError, match="wait_event"):
        native.event_feed.EventFeed(san, san._lock, set(), object.__new__(type("Bare", (), {
            name: None for name in ("has_stream", "create_event", "delete_event", "record_event", "event_recorded")})),
            san._stream, san._sync_site, san._keep, LifetimeSanitizer.on_event_wait)
