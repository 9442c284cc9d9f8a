"""A fork from any thread leaves the child's sanitizers usable.

``fork()`` copies only the forking thread: a lock another thread held at
that moment stays held in the child, by nobody, and the child's first op
under the sanitizer waits forever.  Before a fork, the forking thread takes
every live sanitizer's lock (and the dispatch module's), as glibc takes
malloc's; after it, parent and child release them.  A thread inside a
sanitizer finishes its step first, so the child's model is whole.
"""
from __future__ import annotations

import os
import weakref

_sanitizers: "weakref.WeakSet" = weakref.WeakSet()
_held: list = []  # the locks taken before the fork in progress, in order
_registered = False


def watch(sanitizer) -> None:
    """``sanitizer``'s lock (``_rlock``) is taken around every fork while it lives."""
    global _registered
    _sanitizers.add(sanitizer)
    if not _registered and hasattr(os, "register_at_fork"):
        os.register_at_fork(before=_before, after_in_parent=_after, after_in_child=_after)
        _registered = True


def _locks() -> list:
    from . import dispatch

    # one order for every fork: the dispatch module's lock, then the sanitizers' by id
    return [dispatch._lock, *(s._rlock for s in sorted(list(_sanitizers), key=id))]


def _before() -> None:
    for lock in _locks():
        lock.acquire()
        _held.append(lock)


def _after() -> None:
    while _held:
        _held.pop().release()
