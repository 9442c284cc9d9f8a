"""Who watches the lifetime calls: the hook through which record_use,
record_stream and erase_stream (``calls.py``), the torch-allocator fallback and the
hand-off harness reach the sanitizers without importing them.  The
sanitizer's dispatcher publishes the enabled sanitizers by device type
(``publish``); the callers here ask a fast yes/no for the hot path
(``watching``) and deliver each call to every sanitizer that tracks the
tensor (``notify``, ``track_allocation``).  Internal pollers opt out of the
sanitizer's view of event and stream queries:

    with watchers.internal_polling():
        done = event.query()   # not taken as a host synchronisation
"""
from __future__ import annotations

import contextlib
import threading

_by_type: dict = {}  # device type -> the enabled sanitizers tracking it (replaced, never mutated)
_polling = threading.local()


def publish(by_type: dict) -> None:
    """The enabled sanitizers by the device type they track (the
    sanitizer's dispatcher calls this whenever one is enabled or disabled).
    A sanitizer here takes ``record_use``, ``record_stream``,
    ``erase_stream`` and ``track_allocation`` (tensor, stream key), and its
    ``backend.stream_key(stream)`` gives that key."""
    global _by_type
    _by_type = by_type


def watching(device_type: str) -> bool:
    """True when an enabled sanitizer tracks tensors of ``device_type``
    ("cuda", "npu", or "cpu" for the simulated device)."""
    return bool(_by_type.get(device_type))


def notify(call: str, tensor, stream) -> None:
    """Tells each enabled sanitizer that tracks ``tensor`` of ``call``
    ("record_use", "record_stream" or "erase_stream") for ``stream`` (a torch
    device stream or a ``simdevice.Stream``)."""
    if call not in ("record_use", "record_stream", "erase_stream"):
        raise ValueError(f"call must be record_use, record_stream or erase_stream, not {call!r}")
    for sanitizer in _by_type.get(tensor.device.type, ()):
        getattr(sanitizer, call)(tensor, sanitizer.backend.stream_key(stream))


def declare_access(tensor, stream, is_write: bool, what: str) -> None:
    """Tells each enabled sanitizer that tracks ``tensor`` that ``what`` (a
    library working on raw pointers) reads or writes its memory on
    ``stream``; a race or an uncovered use it makes is reported as an op's."""
    for sanitizer in _by_type.get(tensor.device.type, ()):
        sanitizer.declare_access(tensor, sanitizer.backend.stream_key(stream), is_write, what)


def track_allocation(tensor, stream) -> None:
    """Tells each enabled sanitizer that tracks ``tensor`` that its storage
    was just allocated on ``stream`` by an allocator no backend sees (the
    simulated device's hand-off harness allocates from the shim)."""
    for sanitizer in _by_type.get(tensor.device.type, ()):
        sanitizer.track_allocation(tensor, sanitizer.backend.stream_key(stream))


@contextlib.contextmanager
def internal_polling():
    """Event and stream queries made inside this block (on this thread) are
    not host synchronisations for the sanitizer: a reclaimer polling its own
    events learns nothing the program could rely on."""
    outer = getattr(_polling, "on", False)
    _polling.on = True
    try:
        yield
    finally:
        _polling.on = outer


def polling_internally() -> bool:
    return getattr(_polling, "on", False)
