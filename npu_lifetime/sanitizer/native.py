"""The one seam between the sanitizer and its C parts: the only module
that loads them (``native_parts.load``; sources under ``_c/``), and where a
sanitizer's implementation is chosen (``Parts``: C where built, or the
Python reference of ``feeds.py``).  Each C part has a Python equivalent
with the same interface, the reference it is tested against (both ways in
one process: tests/conftest.py's ``both_ways``).

A sanitizer's own parts (``Parts``, chosen when it is built):
- ``op_feed`` (_op_feed.c): an op's accesses into the model (``feeds.feed_op``);
- ``storage_feed`` (_storage_feed.c): an allocation or free into the
  storage table and the model (``feeds.StorageFeed``);
- ``event_feed`` (_event_feed.c): device events into the model, what the
  sanitizer's ``on_event_*``, ``on_wait_stream`` and ``on_*_sync`` call
  (``feeds.EventFeed``);
- ``host_lock`` (_host_lock.c): the sanitizer's lock (``feeds.HostLock``);
- ``dispatch`` (_dispatch.c): the dispatch mode's fast path for the common
  op (``dispatch.py``'s ``_Mode`` body is the reference);
- the lifetime model itself (``lifetime/native_model.cpp``, ``model_class``).

The process's parts (one per process, read by the modules named):
- ``frames`` (_frames.c): the stack walk of a site capture, and the site
  it makes (``sites.py``; ``Site``'s slots are then its C base's);
- ``scan`` (_scan.c): which storages an op's tensor arguments touch
  (``accesses.py``; ``StorageAccess``'s slots are then its C base's, which
  the op feed reads directly);
- ``trace_hook`` (_trace_hook.c): the device allocation trace's delivery to
  the sanitizers' storage feeds (``backends.py``);
- ``event_hook`` (_event_hook.c): device events' delivery to the sanitizers,
  or to the op in progress (``hub.py``'s ``Hub.event``, ``backends.py``);
- ``threads`` (_threads.c): threads already running when a sanitizer is
  enabled take its dispatch mode at their next Python event (``threads.py``);
- the GPU trace bridge (``trace_bridge.py``, C++ built against the torch in
  use and installed by the first CUDA sanitizer): torch's trace delivered
  to its Python registries without torch's import per event; ``in_use()``
  says whether it is installed now, the others whether they were built.

Each module is None where it was not built.  ``NPU_LIFETIME_NATIVE=0`` turns
all of them off (the pure-Python sanitizer), ``NPU_LIFETIME_MODEL=python``
only the model.
"""
from __future__ import annotations

import os

from ..native_parts import ENABLED, load
from . import trace_bridge


def _load(name: str):
    return load(f"{__package__}.{name}")


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


class Parts:
    """One implementation of each of a sanitizer's own parts, all C or all
    Python, with the same constructors and methods (``feeds.py`` holds the
    Python ones, the reference):

    - ``model``: the lifetime model's class;
    - ``host_lock``: ``HostLock(rlock, sanitizer)``, the sanitizer's lock;
    - ``op_feed``: ``feed(found, live, sizeless, first_sight, set_size,
      access, stream, fresh_stream, op_name, site)``, an op's accesses;
    - ``storage_feed``: ``StorageFeed(...)``, allocations and frees;
    - ``event_feed``: ``EventFeed(...)``, device events;
    - ``dispatch``: _dispatch.c's fast path for the common op, or None
      (every op to ``_Mode.__torch_dispatch__``'s Python body).

    ``LifetimeSanitizer(parts=...)`` takes one; ``default()`` is the C
    where it was built.  The process-wide parts above (``frames``,
    ``scan``, ``trace_hook``, ``event_hook``, ``threads``) are not a
    sanitizer's: only ``NPU_LIFETIME_NATIVE=0`` turns them off."""

    __slots__ = ("name", "model", "host_lock", "op_feed", "storage_feed", "event_feed", "dispatch")

    def __init__(self, name: str, model: type, host_lock, op_feed, storage_feed, event_feed, dispatch) -> None:
        self.name, self.model, self.host_lock, self.op_feed = name, model, host_lock, op_feed
        self.storage_feed, self.event_feed, self.dispatch = storage_feed, event_feed, dispatch

    def __repr__(self) -> str:
        return f"Parts({self.name})"

    def replace(self, **changes) -> "Parts":
        """These parts with some replaced (a test's faulty model or feed)."""
        fields = {name: getattr(self, name) for name in self.__slots__}
        return Parts(**{**fields, **changes})


def python_parts() -> Parts:
    """The pure-Python sanitizer (the reference)."""
    from .. import lifetime
    from . import feeds

    return Parts("python", lifetime.model_class("python"), feeds.HostLock, feeds.feed_op, feeds.StorageFeed,
                 feeds.EventFeed, None)


def native_parts() -> Parts:
    """The C parts where they were built (each missing one is Python's)."""
    py = python_parts()
    fast_path = dispatch if scan is not None and frames is not None and op_feed is not None else None
    return Parts("native", model_class(),
                 host_lock.HostLock if host_lock is not None else py.host_lock,
                 op_feed.feed if op_feed is not None else py.op_feed,
                 storage_feed.StorageFeed if storage_feed is not None else py.storage_feed,
                 event_feed.EventFeed if event_feed is not None else py.event_feed,
                 fast_path)


_default = None


def default() -> Parts:
    """What a sanitizer is built with when not told: C where built (none with
    ``NPU_LIFETIME_NATIVE=0``, whose modules above are then all None)."""
    global _default
    if _default is None:
        _default = native_parts()
    return _default


def in_use() -> dict:
    """Which native parts this process uses (for benchmarks and reports)."""
    return {"frames": frames is not None, "scan": scan is not None, "feed": op_feed is not None,
            "dispatch": dispatch is not None,
            "storage_feed": storage_feed is not None, "trace_hook": trace_hook is not None,
            "host_lock": host_lock is not None, "event_hook": event_hook is not None,
            "event_feed": event_feed is not None, "threads": threads is not None, "trace_bridge": trace_bridge.installed(),
            "model": model_class().__module__.endswith("_native_model")}
