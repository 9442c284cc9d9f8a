"""One sink per enabled sanitizer: the sanitizers listening to a device
backend, and the delivery of its device events to every one of them.

A device event (stream, event, synchronisation) goes to each enabled
sanitizer of the backend, in the order the program issued it.  Events issued
*inside* an op (a host sync inside ``.item()``, a collective's launch wait,
a cross-device copy's barrier and completion events) are held by the op's
frame (``dispatch.py``) until the op's accesses are known, then replayed with
the accesses put in place (``lifetime.op_order``).  Allocations and frees are
never held: the shim needs its answer at once, and they come in order anyway.
"""
from __future__ import annotations

import threading
from typing import Callable, Optional

# how a device event's subscriber turns its arguments into the sinks' (Hub.subscriber)
KEEP_ARGS, KEY_LAST, DEVICE_ONLY = 0, 1, 2

# device events whose order relative to an op's accesses matters
HELD = frozenset({
    "on_stream_created", "on_event_created", "on_event_deleted", "on_event_record",
    "on_event_wait", "on_event_sync", "on_stream_sync", "on_device_sync",
    "on_wait_stream", "on_current_stream_waits",
})

class _OpOnThread(threading.local):
    frame: Optional["OpFrame"] = None  # a class default: a missing thread-local attribute costs an exception


# ``on_thread.frame``: the op being dispatched on this thread, or None; set by the dispatch mode around
# each op and read directly (not through a function: it is read several times per op)
on_thread = _OpOnThread()


class OpFrame:
    """The op being dispatched on this thread: its site, and the device
    events it issued, held until its accesses are known (the C dispatch's
    OpFrame has the same slots: ``Parts.op_frame``)."""

    __slots__ = ("site", "held")

    def __init__(self, site) -> None:
        self.site = site
        self.held: list = []  # (hub, name, args)



class Hub:
    """The enabled sanitizers of one backend."""

    def __init__(self) -> None:
        self.sinks: tuple = ()  # replaced, never mutated: read without the lock
        self._lock = threading.Lock()

    def add(self, sink) -> None:
        with self._lock:
            if sink not in self.sinks:
                self.sinks = (*self.sinks, sink)

    def remove(self, sink) -> None:
        with self._lock:
            self.sinks = tuple(s for s in self.sinks if s is not sink)

    def event(self, name: str, *args) -> None:
        """A device event: to every sink now, or held by the op in progress."""
        sinks = self.sinks
        if not sinks:
            return
        frame = on_thread.frame
        if frame is not None and name in HELD:
            frame.held.append((self, name, args))
            return
        for sink in sinks:
            getattr(sink, name)(*args)

    def subscriber(self, name: str, device: Optional[Callable] = None, keying: int = KEEP_ARGS):
        """A subscriber delivering the device event ``name`` as ``event``
        does, its arguments made the sinks' by ``keying``: as given; the last
        one, a stream handle, made the key ``(device(), handle)``; or
        ``(device(),)`` for an event with no argument.  In Python (the
        reference of ``Parts.event_subscriber``, whose C one makes no Python
        frame per event)."""
        event, hub = self.event, self
        if keying == KEY_LAST:
            def key_last(*args) -> None:
                if hub.sinks:  # with no sink, the device is not asked (as in C)
                    if not args:
                        raise TypeError(f"{name} takes a stream handle last")
                    event(name, *args[:-1], (device(), args[-1]))

            return key_last
        if keying == DEVICE_ONLY:
            def device_only() -> None:
                if hub.sinks:
                    event(name, device())

            return device_only
        return lambda *args: event(name, *args)

    def direct(self, name: str):
        """The delivery of a device event that is never held (an allocation,
        a free): straight to every sink, with no frame to look up (called by
        the allocator's trace on every allocation and free)."""
        if name in HELD:
            raise ValueError(f"{name} is held by the op in progress: deliver it with event()")

        def deliver(*args) -> None:
            for sink in self.sinks:
                getattr(sink, name)(*args)

        return deliver

    def deliver(self, name: str, args: tuple) -> None:
        for sink in self.sinks:
            getattr(sink, name)(*args)
