"""The sanitizer's device-event feed in C (_event_feed.c) against its
Python reference (feeds.py's EventFeed, which sanitizer.py's on_event_* /
on_wait_stream / on_*_sync call):
the same model calls with the same arguments in the same order, on random
event sequences; the same line named where the host waited, with both
models; the calling thread made the host; errors raised with the lock
released (the storage feed's too: host_entry.h); no reference leaked."""
import gc
import random
import sys
import threading

import pytest
import torch

from npu_lifetime import simdevice as sd
from npu_lifetime.sanitizer import LifetimeSanitizer, feeds, native

if native.event_feed is None:
    pytest.skip("the sanitizer's native event feed is off or not built", allow_module_level=True)

HANDLERS = ("on_event_created", "on_event_deleted", "on_event_record", "on_event_wait", "on_wait_stream",
            "on_stream_sync", "on_device_sync")


def _parts(use_native: bool) -> native.Parts:
    """The native parts, with the event feed C's or Python's (the rest the same)."""
    parts = native.native_parts()
    return parts if use_native else parts.replace(name="native, event feed python", event_feed=feeds.EventFeed)


class _LoggingModel:
    """Stands in for the lifetime model: logs each call (a lazy site as
    'lazy site': calling it from here would name this file); a wait on
    event 'found' finds one."""

    def __init__(self, log: list) -> None:
        self.log, self.streams = log, set()

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

    def record_event(self, event, key):
        self._logged("record_event", event, key)

    def wait_event(self, key, event, site=None):
        self._logged("wait_event", key, event, site)
        return ["a finding"] if event == "found" else []

    def wait_stream(self, waiter, waitee):
        self._logged("wait_stream", waiter, waitee)

    def synchronize_stream(self, key, site=None):
        self._logged("synchronize_stream", key, site)

    def synchronize_device(self, device, site=None):
        self._logged("synchronize_device", device, site)


def _plain(value):
    """A logged argument, comparable across the two paths (sites are objects)."""
    if value is None or isinstance(value, (int, str, tuple, list)):
        return value
    return "lazy site" if callable(value) else type(value).__name__


def _sanitizer(log: list, use_native: bool) -> LifetimeSanitizer:
    san = LifetimeSanitizer("sim", parts=_parts(use_native))
    san.model = _LoggingModel(log)
    san._keep = lambda found: found and log.append(("keep", tuple(found)))  # _keep: nothing for no findings
    san._events = san._make_event_feed()  # over the logging model
    assert isinstance(san._events, native.event_feed.EventFeed if use_native else feeds.EventFeed)
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
    assert len([entry for entry in native_log if entry[0] not in ("call", "known")]) > 10  # the model was called


def test_an_unrecorded_wait_and_a_found_one_go_where_the_python_body_sends_them():
    calls = [("on_event_created", ("e1",)), ("on_event_wait", ("e1", (0, 1))),  # unrecorded: no site, _keep drops it
             ("on_event_record", ("found", (0, 0))), ("on_event_wait", ("found", (0, 1))),  # kept
             ("on_event_wait", ("unknown", (0, 2))),  # created before enable(): nothing
             ("on_stream_sync", ((0, 0),)), ("on_device_sync", (0,))]
    native_log = _run(calls, use_native=True)
    assert native_log == _run(calls, use_native=False)
    waits = [entry for entry in native_log if entry[0] == "wait_event"]
    assert [wait[1] for wait in waits] == [((0, 1), "e1", None), ((0, 1), "found", None)]
    assert ("keep", ("a finding",)) in native_log
    syncs = [entry for entry in native_log if entry[0].startswith("synchronize")]
    assert [entry[1][1] for entry in syncs] == ["lazy site", "lazy site"]


def _host_wait_reason(monkeypatch, use_native: bool, direct: bool) -> str:
    """The 'why latent' line of a free whose use the host waited past: by
    side.synchronize() (through the sim device's Python), or by calling
    the handler straight from a function of this file (no frame between)."""
    san = LifetimeSanitizer("sim", on_race="warn", warn_on_free=False, parts=_parts(use_native))

    def waits_for(side):
        if direct:
            san.on_stream_sync(side.key)  # the host waits (direct)
        else:
            side.synchronize()  # the host waits (sim)

    with san:
        side = sd.Stream()
        x = torch.ones(64)
        side.wait_stream(sd.default_stream())
        with sd.stream(side):
            y = x + 1
        del x
        gc.collect()
        waits_for(side)
        del y
        gc.collect()
    reasons = [text for text in san.report(san.flush()).splitlines() if "host waited" in text]
    assert len(reasons) == 1
    return reasons[0]


@pytest.mark.parametrize("model", ["native", "python"])
@pytest.mark.parametrize("direct", [False, True], ids=["through-the-device", "handler-called-directly"])
def test_a_latent_free_names_the_line_where_the_host_waited_on_both_paths(monkeypatch, model, direct):
    monkeypatch.setenv("NPU_LIFETIME_MODEL", model)
    mark = "# the host waits (direct)" if direct else "# the host waits (sim)"
    line = next(n for n, text in enumerate(open(__file__), 1) if mark in text and "mark =" not in text)
    native_reason = _host_wait_reason(monkeypatch, use_native=True, direct=direct)
    assert f"host waited past the use at {__file__}:{line} in waits_for" in native_reason
    assert _host_wait_reason(monkeypatch, use_native=False, direct=direct) == native_reason


def _in_thread(call):
    """call() on a new thread: its result or its exception, and the thread's ident."""
    out = {}

    def run():
        out["ident"] = threading.get_ident()
        try:
            out["result"] = call()
        except BaseException as error:  # noqa: BLE001 - handed back to the test
            out["error"] = error

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return out


def _lock_is_free(san) -> bool:
    """Whether another thread can take the sanitizer's lock now."""
    return _in_thread(lambda: san._rlock.acquire(timeout=5) and san._rlock.release()).get("result", 0) is None


@pytest.mark.parametrize("use_native", [True, False])
def test_a_handler_called_on_another_thread_makes_it_the_host(use_native):
    san = _sanitizer([], use_native)
    san.model.set_host = lambda host: san.model.log.append(("set_host", host))
    out = _in_thread(lambda: san.on_event_created("e1"))
    assert "error" not in out and san._host == out["ident"]
    assert san.model.log == [("set_host", out["ident"]), ("create_event", ("e1",))]


@pytest.mark.parametrize("feed", ["event", "storage"])
def test_a_failing_host_switch_raises_with_the_lock_released(feed):
    san = LifetimeSanitizer("sim")

    def refuses():
        raise LookupError("no host switch")

    san._set_host = refuses
    call = (lambda: san.on_event_created("e1")) if feed == "event" else (lambda: san._storage_feed.free(0x1000))
    out = _in_thread(call)
    assert isinstance(out.get("error"), LookupError)
    free = san._rlock.acquire(blocking=False)  # here: a new thread may reuse the ended one's ident, so own its RLock
    assert free
    san._rlock.release()


def test_a_failing_model_call_raises_with_the_lock_released():
    log: list = []
    san = _sanitizer(log, use_native=True)

    def broken(*args):
        raise KeyError("the model failed")

    san.model.record_event = broken
    san._events = san._make_event_feed()  # looks the model's methods up again
    with pytest.raises(KeyError, match="the model failed"):
        san.on_event_record("e1", (0, 0))
    assert _lock_is_free(san)


def test_the_handlers_keep_no_reference():
    san = _sanitizer([], use_native=True)
    event, key, other = object(), (0, 7), (0, 8)
    found = ["a finding"]
    san.model.wait_event = lambda *args: found
    san._keep = lambda f: None
    san._events = san._make_event_feed()

    def every_handler(times):
        for _ in range(times):
            san.on_event_created(event)
            san.on_event_record(event, key)
            san.on_event_wait(event, other)
            san.on_wait_stream(key, other)
            san.on_stream_sync(key)
            san.on_device_sync(0)
            san.on_event_deleted(event)
        san.model.log.clear()  # the log holds what it logged

    every_handler(1)  # the model's stream set holds the keys from here on
    before = [sys.getrefcount(obj) for obj in (event, key, other, found)]
    every_handler(1000)
    assert [sys.getrefcount(obj) for obj in (event, key, other, found)] == before


def test_a_subclass_handler_stays_the_subclass_s():
    class Counting(LifetimeSanitizer):
        def on_event_record(self, event, key):
            self.counted = getattr(self, "counted", 0) + 1

    san = Counting("sim")
    san.on_event_record("e1", (0, 0))
    assert san.counted == 1 and isinstance(san._events, native.event_feed.EventFeed)  # the others reach C


@pytest.mark.parametrize("name, args", [("on_event_record", ("e1",)), ("on_event_wait", ("e1", (0, 0), 3)),
                                        ("on_wait_stream", ((0, 0),))])
def test_a_handler_called_with_the_wrong_arguments_says_so(name, args):
    san = _sanitizer([], use_native=True)
    with pytest.raises(TypeError, match=name):
        getattr(san._events, name)(*args)


def test_the_feed_refuses_a_model_without_the_methods_it_calls():
    san = LifetimeSanitizer("sim")
    bare = type("Bare", (), {name: None for name in ("has_stream", "create_event", "delete_event", "record_event")})()
    with pytest.raises(AttributeError, match="wait_event"):
        native.event_feed.EventFeed(san, san._rlock, set(), bare, san._stream, san._sync_site, san._keep)


def test_a_feed_made_without_init_raises_instead_of_crashing():
    with pytest.raises(TypeError, match="not initialised"):
        native.event_feed.EventFeed.__new__(native.event_feed.EventFeed).on_device_sync(0)
    if native.storage_feed is not None:
        with pytest.raises(TypeError, match="not initialised"):
            native.storage_feed.StorageFeed.__new__(native.storage_feed.StorageFeed).trace_free(0x1000)
