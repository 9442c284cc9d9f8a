"""The sanitizer's native parts, each an optional C extension with a Python
equivalent that stays the fallback and the reference it is tested against:

- ``frames`` (_frames.c): the stack walk of a site capture, and the site
  it makes (``sites.py``; ``Site``'s slots are then its C base's);
- ``scan`` (_scan.c): which storages an op's tensor arguments touch
  (``accesses.py``; ``StorageAccess``'s slots are then its C base's, which
  ``feed`` reads directly);
- ``feed`` (_feed.c): an op's accesses into the model (``sanitizer.py``);
- ``dispatch`` (_dispatch.c): the dispatch mode's ``__torch_dispatch__``,
  which runs the common op itself (``dispatch.py``'s ``_Mode``);
- ``storage_feed`` (_storage_feed.c): an allocation or free into the
  storage table and the model (``sanitizer.py``, ``storages.py``);
- ``event_feed`` (_event_feed.c): device events into the model, the
  sanitizer's ``on_event_*``, ``on_wait_stream`` and ``on_*_sync`` handlers
  (``sanitizer.py``);
- ``host_lock`` (_host_lock.c): the sanitizer's lock (``sanitizer.py``,
  ``_HostLock``);
- ``trace_hook`` (_trace_hook.c): the device allocation trace's delivery to
  the sanitizers (``backends.py``, ``hub.py``);
- ``event_hook`` (_event_hook.c): device events' delivery to the sanitizers,
  or to the op in progress (``hub.py``'s ``Hub.event``, ``backends.py``);
- ``threads`` (_threads.c): threads already running when a sanitizer is
  enabled take its dispatch mode at their next Python event (``threads.py``);
- the GPU trace bridge (``trace_bridge.py``, C++ built against the torch in
  use and installed by the first CUDA sanitizer): torch's trace delivered
  to its Python registries without torch's import per event; ``in_use()``
  says whether it is installed now, the others whether they were built;
- the lifetime model itself (``lifetime/native_model.cpp``, ``model_class``).

Each is None where it was not built.  ``NPU_LIFETIME_NATIVE=0`` turns all of
them off (the pure-Python sanitizer), ``NPU_LIFETIME_MODEL=python`` only the
model: CI runs the sanitizer's tests both ways.
"""
from __future__ import annotations

import os

from ..native_parts import ENABLED, load
from . import trace_bridge


def _load(name: str):
    return load(f"{__package__}.{name}")


frames = _load("_frames")
scan = _load("_scan")
feed = _load("_feed")
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


def in_use() -> dict:
    """Which native parts this process uses (for benchmarks and reports)."""
    return {"frames": frames is not None, "scan": scan is not None, "feed": feed is not None, "dispatch": dispatch is not None,
            "storage_feed": storage_feed is not None, "trace_hook": trace_hook is not None,
            "host_lock": host_lock is not None, "event_hook": event_hook is not None,
            "event_feed": event_feed is not None, "threads": threads is not None, "trace_bridge": trace_bridge.installed(),
            "model": model_class().__module__.endswith("_native_model")}
