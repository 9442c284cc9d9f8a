"""Process-wide allocation and free hooks of the shim, shared by every
subscriber (each enabled sanitizer).

The native hooks are set once, on the first subscription (again only when
a test switches between _hook_relay.c and the ctypes callbacks:
use_relay), and cleared at interpreter exit (before torch frees its last
tensors, so no free calls into a finalising interpreter).  Subscribers come and go in Python: a
subscription is never torn down while a native call is inside it.

    sub = hooks.subscribe(on_alloc, on_free)   # each (ptr, size, device, stream)
    ...
    hooks.unsubscribe(sub)
"""
from __future__ import annotations

import atexit
import sys
import threading
import traceback
from dataclasses import dataclass
from typing import Callable, Optional

from ..native_parts import load
from .libnpl import ALLOC_HOOK, FREE_HOOK, library

Callback = Callable[[int, int, int, int], None]


@dataclass(frozen=True, eq=False)
class Subscription:
    on_alloc: Optional[Callback]
    on_free: Optional[Callback]
    on_findings: Optional[Callable[[int, list], None]] = None


_lock = threading.Lock()
_subscribers: tuple = ()  # replaced, never mutated: native calls read it without the lock
_native = None  # the hooks set (ctypes function pointers), kept alive while set


_BUILT_RELAY = load(f"{__package__}._hook_relay")
relay = _BUILT_RELAY  # _hook_relay.c, or None: the ctypes callbacks below (use_relay)
_retired: list = []  # hooks replaced by use_relay: kept alive, a call may still be inside one


def subscribe(on_alloc: Optional[Callback], on_free: Optional[Callback],
              on_findings: Optional[Callable[[int, list], None]] = None) -> Subscription:
    sub = Subscription(on_alloc, on_free, on_findings)
    with _lock:
        _publish((*_subscribers, sub))
        _set_native()
    return sub


def unsubscribe(sub: Subscription) -> None:
    with _lock:
        _publish(tuple(s for s in _subscribers if s is not sub))


def _publish(subs: tuple) -> None:
    global _subscribers
    _subscribers = subs
    if relay is not None:
        relay.set_subscribers(tuple((s.on_alloc, s.on_free, s.on_findings) for s in subs))


def subscribers() -> tuple:
    return _subscribers


def _on_alloc(ptr, size, device, stream, _ctx) -> None:
    for sub in _subscribers:
        if sub.on_alloc is not None:
            _call(sub.on_alloc, ptr or 0, size, device, stream or 0)


def _on_free(ptr, size, device, stream, _ctx) -> None:
    for sub in _subscribers:
        if sub.on_free is not None:
            found = _call(sub.on_free, ptr or 0, size, device, stream or 0)
            if sub.on_findings is not None and type(found) is list and found:
                _call(sub.on_findings, ptr or 0, found)


def _call(fn, *args):
    """fn(*args); an exception is reported and the relay goes on to the
    next subscriber (the allocator never sees it), as _hook_relay.c does."""
    try:
        return fn(*args)
    except Exception:
        print(f"Exception ignored in shim hook subscriber {fn!r}:", file=sys.stderr)
        traceback.print_exc()
        return None


def _set_native() -> None:
    global _native
    if _native is None:
        if relay is not None:
            _native = (ALLOC_HOOK(relay.alloc_hook()), FREE_HOOK(relay.free_hook()))
        else:
            _native = (ALLOC_HOOK(_on_alloc), FREE_HOOK(_on_free))
        library().npl_set_hooks(*_native, None)


def use_relay(native: bool) -> None:
    """The shim's hooks from now on: _hook_relay.c's (where built) or the
    ctypes callbacks, each with the current subscribers (the both-ways
    tests' switch).  Hooks already set are replaced."""
    global relay, _native
    with _lock:
        chosen = _BUILT_RELAY if native else None
        if chosen is relay:
            return
        if relay is not None:
            relay.set_subscribers(())
        relay = chosen
        _publish(_subscribers)
        if _native is not None:
            _retired.append(_native)
            _native = None
            _set_native()


def _clear_native() -> None:
    with _lock:
        _publish(())
        if _native is not None:
            library().npl_set_hooks(ALLOC_HOOK(), FREE_HOOK(), None)


atexit.register(_clear_native)
