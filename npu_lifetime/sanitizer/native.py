"""The one seam between the sanitizer and its C parts: the only module that
loads them (``native_parts.load``; sources under ``_c/``) and the only one
that chooses between C and Python.  Each C part implements a Python class or
function of the same interface, the reference it is tested against (both
ways in one process: tests/conftest.py's ``both_ways``); the Python modules
never import C, they are handed the implementation in a ``Parts``.

``Parts``: one implementation of everything a sanitizer runs, all C (where
built) or all Python (``python_parts()``: the pure-Python sanitizer).  Each
field, C's / Python's:
- ``model``: the lifetime model (``lifetime/native_model.cpp`` / ``model.py``);
- ``host_lock`` (_host_lock.c / ``feeds.HostLock``): the sanitizer's lock;
- ``op_feed`` (_op_feed.c / ``feeds.feed_op``): an op's accesses into the model;
- ``storage_feed`` (_storage_feed.c / ``feeds.StorageFeed``): an allocation
  or free into the storage table and the model;
- ``event_feed`` (_event_feed.c / ``feeds.EventFeed``): device events into
  the model;
- ``dispatch`` (_dispatch.c / None): the dispatch mode's fast path for the
  common op (``dispatch.py``'s ``_Mode`` body is the reference);
- ``capture`` (_frames.c / ``sites.capture``): a call site's stack walk,
  which makes ``Site``s (C's: ``CSite`` below, slots from the C base);
- ``scan`` (_scan.c / ``accesses.PythonScan``): which storages an op's
  tensor arguments touch, as ``StorageAccess``es (C's: ``CStorageAccess``
  below, whose slots the C op feed reads directly);
- ``op_frame`` (_dispatch.c's / ``hub.OpFrame``): an op in progress;
- ``event_subscriber`` (_event_hook.c / ``hub.Hub.subscriber``): device
  events' delivery to the sanitizers, or to the op in progress;
- ``trace_delivery`` (_trace_hook.c and the GPU trace bridge /
  ``backends.TraceDelivery``): the device trace's allocations and frees;
- ``running_threads`` (_threads.c / ``threads.RunningThreads``): threads
  already running when a sanitizer is enabled take its dispatch mode at
  their next Python event.

``LifetimeSanitizer(parts=...)`` takes one; ``default()`` (C where built)
otherwise.  The sanitizer hands its parts to what it builds: its feeds, the
dispatch mode (the first enabled sanitizer's parts), and the device
backend's deliveries (made once per process, at the first ``enable()``).

``NPU_LIFETIME_NATIVE=0`` loads none of the C parts (the pure-Python
sanitizer), ``NPU_LIFETIME_MODEL=python`` leaves out only the model.
"""
from __future__ import annotations

import dataclasses
import os
import sys
from typing import Callable

import torch

from ..native_parts import ENABLED, load
from . import accesses, backends, feeds, hub, sites, trace_bridge
from . import dispatch as dispatch_mode
from .threads import RunningThreads


def _load(name: str):
    return load(f"{__package__}.{name}")


# each None where it was not built, or with NPU_LIFETIME_NATIVE=0
frames = _load("_frames")
scan = _load("_scan")
op_feed = _load("_op_feed")
dispatch = _load("_dispatch")
storage_feed = _load("_storage_feed")
trace_hook = _load("_trace_hook")
host_lock = _load("_host_lock")
event_hook = _load("_event_hook")
event_feed = _load("_event_feed")
threads = _load("_threads")


def model_class() -> type:
    """The lifetime model the sanitizer feeds: the native one (C++, the same
    semantics, checked against model.py by tests/model/test_native_model.py and
    ``npu-lifetime fuzz --model native``) where it was built, else model.py's."""
    from .. import lifetime

    asked = os.environ.get("NPU_LIFETIME_MODEL", "native")
    if asked not in lifetime.MODELS:
        raise ValueError(f"NPU_LIFETIME_MODEL must be one of {lifetime.MODELS}, not {asked!r}")
    use_native = ENABLED and asked == "native" and lifetime.native_available()
    return lifetime.model_class("native" if use_native else "python")


@dataclasses.dataclass(frozen=True, repr=False)
class Parts:
    """One implementation of each part (the fields: see the module's
    docstring), all C or all Python, with the same constructors, methods
    and arguments."""

    name: str
    model: type
    host_lock: Callable  # HostLock(rlock, sanitizer)
    op_feed: Callable  # feed(found, live, sizeless, first_sight, set_size, access, stream, fresh_stream, op, site)
    storage_feed: Callable  # StorageFeed(...)
    event_feed: Callable  # EventFeed(...)
    dispatch: object  # the C fast path's module, or None: every op to the body
    capture: Callable  # capture(depth, skip): skip 0 is the caller's frame
    scan: object  # .op(...), .written(arguments, args, kwargs)
    op_frame: type  # OpFrame(site)
    event_subscriber: Callable  # (hub, name, device, keying) -> subscriber
    trace_delivery: object  # .memory_subscribers(backend), .shortcut(registry, subscriber), .install_bridge()
    running_threads: object  # .follow_running(enter), .stop_following(), .following_running_threads()

    def __repr__(self) -> str:
        return f"Parts({self.name})"

    def replace(self, **changes) -> "Parts":
        """These parts with some replaced (a test's faulty model or feed)."""
        return dataclasses.replace(self, **changes)


def python_parts() -> Parts:
    """The pure-Python sanitizer (the reference)."""
    from .. import lifetime

    return Parts(name="python", model=lifetime.model_class("python"), host_lock=feeds.HostLock,
                 op_feed=feeds.feed_op, storage_feed=feeds.StorageFeed, event_feed=feeds.EventFeed, dispatch=None,
                 capture=sites.capture, scan=accesses.PythonScan, op_frame=hub.OpFrame,
                 event_subscriber=hub.Hub.subscriber, trace_delivery=backends.TraceDelivery,
                 running_threads=RunningThreads)


# -- the C parts' Python sides: classes with C bases, and the C parts' configuration ---------------

if frames is not None:
    class CSite(frames.SiteBase, sites.Site):
        """A site the C walk makes (its slots are the C base's)."""

        __slots__ = ()
        _line = staticmethod(frames.lineno)

    frames.configure(CSite, sites._classify, CSite.frameless, sites._phase, sites._MAX_WALK, sites._LIBRARY_FRAMES)

if scan is not None:
    class CStorageAccess(scan.AccessBase, accesses.StorageAccess):
        """An entry the C scan makes (its slots are the C base's, which the C op feed reads)."""

        __slots__ = ()

    scan.configure(CStorageAccess, (torch.Tensor, torch.nn.Parameter), lambda value: accesses._tensors(value),
                   lambda t: accesses._holders(t))
    if op_feed is not None:
        op_feed.configure_access(scan.AccessBase)

if dispatch is not None:
    def _configure_dispatch() -> None:
        """The C dispatcher runs every op it does not take to the body of
        ``_Mode.__torch_dispatch__`` (within torch's wrapper of it where
        Dynamo is active on the thread)."""
        from torch._C._dynamo.eval_frame import set_eval_frame

        wrapped = dispatch_mode._Mode.__dict__["__torch_dispatch__"]  # torch's Dynamo-disabled wrapper
        dispatch.configure(getattr(wrapped, "__wrapped__", wrapped), wrapped, set_eval_frame)

    _configure_dispatch()


def _c_event_subscriber(hub_: hub.Hub, name: str, device=None, keying: int = hub.KEEP_ARGS):
    """``Hub.subscriber`` in C: no Python frame per event."""
    return event_hook.Event(hub_, name, name in hub.HELD, hub.on_thread, device, keying)


class _BridgedTraceDelivery(backends.TraceDelivery):
    """Python's delivery, with torch's GPU trace delivered by the C++ bridge (``trace_bridge.py``)."""

    install_bridge = staticmethod(trace_bridge.install)


class _CTraceDelivery(_BridgedTraceDelivery):
    """The trace's allocations and frees, each one C call to the sanitizers' storage feeds (_trace_hook.c)."""

    @staticmethod
    def memory_subscribers(backend) -> tuple:
        device, raw_stream = backend._raw_stream_calls()
        return (trace_hook.Deliver(backend.hub, False, device, raw_stream),
                trace_hook.Deliver(backend.hub, True, device, raw_stream))

    @staticmethod
    def shortcut(registry, subscriber) -> None:
        """(_trace_hook.Fire: no Python frame of torch's loop per allocation,
        free or event; other subscribers, CSAN's, still get theirs in order.)"""
        fire = registry.fire_callbacks
        if isinstance(getattr(registry, "callback_list", None), list) and not isinstance(fire, trace_hook.Fire):
            registry.fire_callbacks = trace_hook.Fire(registry.callback_list, subscriber, fire)


if threads is not None:
    class _CRunningThreads(RunningThreads):
        """_threads.c (CPython 3.11 and 3.12): keeps the profile function each thread had."""

        @staticmethod
        def following_running_threads() -> bool:
            return True

        follow_running = staticmethod(threads.follow)
        stop_following = staticmethod(threads.cancel)


def native_parts() -> Parts:
    """The C parts where they were built (each missing one is Python's)."""
    built = {"model": model_class()}
    if host_lock is not None:
        built["host_lock"] = host_lock.HostLock
    if op_feed is not None:
        built["op_feed"] = op_feed.feed
    if storage_feed is not None:
        built["storage_feed"] = storage_feed.StorageFeed
    if event_feed is not None:
        built["event_feed"] = event_feed.EventFeed
    if frames is not None:
        built["capture"] = frames.capture
    if scan is not None:
        built["scan"] = scan
    if dispatch is not None:
        built["op_frame"] = dispatch.OpFrame
        if scan is not None and frames is not None and op_feed is not None:
            built["dispatch"] = dispatch
    if event_hook is not None:
        built["event_subscriber"] = _c_event_subscriber
    if ENABLED:  # the GPU trace bridge is built on first use (trace_bridge.py), not at install
        built["trace_delivery"] = _CTraceDelivery if trace_hook is not None else _BridgedTraceDelivery
    if threads is not None and sys.version_info[:2] in ((3, 11), (3, 12)):
        built["running_threads"] = _CRunningThreads
    return python_parts().replace(name="native", **built)


_default = None


def default() -> Parts:
    """What a sanitizer is built with when not told: C where built (none with
    ``NPU_LIFETIME_NATIVE=0``).  A test sets ``_default`` to
    ``python_parts()`` for the pure-Python sanitizer (tests/conftest.py)."""
    global _default
    if _default is None:
        _default = native_parts() if ENABLED else python_parts()
    return _default


# in_use()'s names: Parts' fields
_IN_USE = {"frames": "capture", "scan": "scan", "feed": "op_feed", "dispatch": "dispatch",
           "storage_feed": "storage_feed", "trace_hook": "trace_delivery", "host_lock": "host_lock",
           "event_hook": "event_subscriber", "event_feed": "event_feed", "threads": "running_threads",
           "model": "model"}


def in_use() -> dict:
    """Which C parts the default parts hold (for benchmarks and reports)."""
    parts, python = default(), python_parts()
    used = {name: getattr(parts, field) is not getattr(python, field) for name, field in _IN_USE.items()}
    used["trace_hook"] = trace_hook is not None and parts.trace_delivery is _CTraceDelivery
    return {**used, "trace_bridge": trace_bridge.installed()}
