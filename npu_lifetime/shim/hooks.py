"""Process-wide allocation and free hooks of the shim, shared by every
subscriber (each enabled sanitizer).

The native hooks are set once, on the first subscription, and cleared at
interpreter exit (before torch frees its last tensors, so no free calls into
a finalising interpreter).  Subscribers come and go in Python: a
subscription is never torn down while a native call is inside it.

    sub = hooks.subscribe(on_alloc, on_free)   # each (ptr, size, device, stream)
    ...
    hooks.unsubscribe(sub)
"""
from __future__ import annotations

import atexit
import threading
from dataclasses import dataclass
from typing import Callable, Optional

from .native import ALLOC_HOOK, FREE_HOOK, library

Callback = Callable[[int, int, int, int], None]


@dataclass(frozen=True, eq=False)
class Subscription:
    on_alloc: Optional[Callback]
    on_free: Optional[Callback]


_lock = threading.Lock()
_subscribers: tuple = ()  # replaced, never mutated: native calls read it without the lock
_native = None  # the ctypes callbacks, kept alive while set


def subscribe(on_alloc: Optional[Callback], on_free: Optional[Callback]) -> Subscription:
    global _subscribers
    sub = Subscription(on_alloc, on_free)
    with _lock:
        _subscribers = (*_subscribers, sub)
        _set_native()
    return sub


def unsubscribe(sub: Subscription) -> None:
    global _subscribers
    with _lock:
        _subscribers = tuple(s for s in _subscribers if s is not sub)


def subscribers() -> tuple:
    return _subscribers


def _on_alloc(ptr, size, device, stream, _ctx) -> None:
    for sub in _subscribers:
        if sub.on_alloc is not None:
            sub.on_alloc(ptr or 0, size, device, stream or 0)


def _on_free(ptr, size, device, stream, _ctx) -> None:
    for sub in _subscribers:
        if sub.on_free is not None:
            sub.on_free(ptr or 0, size, device, stream or 0)


def _set_native() -> None:
    global _native
    if _native is None:
        _native = (ALLOC_HOOK(_on_alloc), FREE_HOOK(_on_free))
        library().npl_set_hooks(*_native, None)


def _clear_native() -> None:
    global _subscribers
    with _lock:
        _subscribers = ()
        if _native is not None:
            library().npl_set_hooks(ALLOC_HOOK(), FREE_HOOK(), None)


atexit.register(_clear_native)
