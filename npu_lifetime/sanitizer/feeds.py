"""The sanitizer's feeds into its lifetime model, in Python: the reference
each C part follows, with the same constructor and methods (``parts.py``
picks one or the other when a sanitizer is built; nothing here calls C).

- ``HostLock(rlock, sanitizer)``: the sanitizer's lock (_host_lock.c);
- ``feed_op(found, live, sizeless, first_sight, set_size, access, stream,
  fresh_stream, op_name, site)``: an op's accesses into the model (_op_feed.c);
- ``StorageFeed(...)``: allocations and frees into the storage table and the
  model (_storage_feed.c);
- ``EventFeed(...)``: device events into the model (_event_feed.c).
"""
from __future__ import annotations

from _thread import get_ident


class HostLock:
    """The sanitizer's lock (reentrant, over ``rlock``): entering it also
    tells the model which host thread issues what follows (each thread has
    its own host clock: a wait on one thread covers nothing another frees;
    a thread started from C++ follows the Python threads, see
    ``LifetimeSanitizer._set_host``).  ``_set_host`` is called only when
    the thread changed."""

    __slots__ = ("_sanitizer", "acquire", "release")

    def __init__(self, rlock, sanitizer) -> None:
        self._sanitizer = sanitizer
        self.acquire, self.release = rlock.acquire, rlock.release

    def __enter__(self):
        _enter(self.acquire, self.release, self._sanitizer)
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _enter(acquire, release, sanitizer) -> None:
    """Takes the lock; the calling thread becomes the model's host (host_entry.h)."""
    acquire()
    if get_ident() != sanitizer._host:
        try:
            sanitizer._set_host()
        except BaseException:
            release()
            raise


class _Held:
    """``with _Held(feed):`` the feed's lock, entered as ``HostLock`` does."""

    __slots__ = ("_feed",)

    def __init__(self, feed) -> None:
        self._feed = feed

    def __enter__(self) -> None:
        f = self._feed
        _enter(f._acquire, f._release, f._sanitizer)

    def __exit__(self, *exc) -> None:
        self._feed._release()


def feed_op(found: list, live: dict, sizeless: set, first_sight, set_size, access, stream: tuple,
            fresh_stream: tuple, op_name: str, site) -> list:
    """An op's accesses (``StorageAccess`` entries) into the model, the lock
    held; returns the races.  A storage not in the table is first seen
    (``first_sight``); a sizeless one learns its size here
    (``StorageTable.sized``)."""
    races: list = []
    for a in found:
        sid = live.get(a.storage)
        if sid is None:
            sid = first_sight(a, fresh_stream, site)
        elif sizeless and sid in sizeless:
            nbytes = a.nbytes
            if nbytes:
                sizeless.discard(sid)
                set_size(sid, nbytes)
        if a.accessed:
            r = access(sid, stream, a.is_write, op_name, site, tuple(a.names))
            if r:
                races += r
    return races


class StorageFeed:
    """An allocation or free into one sanitizer's storage table
    (``StorageTable``, the reference) and model.  The constructor takes
    what _storage_feed.c's does (its header documents each argument); the
    table's methods do the work here."""

    def __init__(self, sanitizer, lock, shim, live, sizeless, ids, blocks_before, allocate, free, has_stream,
                 stream, on_thread, capture) -> None:
        self._sanitizer, self._shim, self._stream = sanitizer, shim, stream
        self._acquire, self._release = lock.acquire, lock.release
        self._on_thread, self._capture = on_thread, capture

    def _op_site(self):
        frame = self._on_thread.frame
        return frame.site if frame is not None else None

    def allocate(self, address: int, size: int, key: tuple, site=None) -> int:
        if site is None:
            site = self._op_site() or self._capture()
        with _Held(self):
            return self._sanitizer.storages.allocate(address, size, self._stream(key), site)

    def free(self, address: int, sid=None) -> list:
        site = self._op_site() or self._capture  # the capture itself: called only if a finding needs it
        with _Held(self):
            return self._sanitizer.storages.free(address, site, sid)

    def trace_alloc(self, address: int, key: tuple) -> None:
        if not self._shim.connected:  # else the shim reports allocations itself
            self.allocate(address, 0, key)

    def trace_free(self, address: int):
        return None if self._shim.connected else self.free(address)

    def shim_alloc(self, ptr: int, size: int, device, stream) -> None:
        self.allocate(ptr, size, (device, stream))

    def shim_free(self, ptr: int, _size, _device, _stream) -> list:
        return self.free(ptr)


class EventFeed:
    """Device events into one sanitizer's model: the model calls of
    _event_feed.c (whose header documents the arguments), in Python."""

    def __init__(self, sanitizer, lock, known: set, model, stream, sync_site, keep) -> None:
        self._sanitizer, self._known, self._model = sanitizer, known, model
        self._acquire, self._release = lock.acquire, lock.release
        self._stream, self._sync_site, self._keep = stream, sync_site, keep

    def on_event_created(self, event) -> None:
        with _Held(self):
            self._known.add(event)
            self._model.create_event(event)

    def on_event_deleted(self, event) -> None:
        with _Held(self):
            self._known.discard(event)
            self._model.delete_event(event)

    def on_event_record(self, event, key) -> None:
        with _Held(self):
            self._known.add(event)
            self._model.create_event(event)
            self._model.record_event(event, self._stream(key))

    def on_event_wait(self, event, key) -> None:
        with _Held(self):
            if event in self._known:  # else created and recorded before we were enabled
                found = self._model.wait_event(self._stream(key), event)
                if found:  # unrecorded: _keep drops it, no site
                    self._keep(found)

    def on_wait_stream(self, waiter, waitee) -> None:
        with _Held(self):
            self._model.wait_stream(self._stream(waiter), self._stream(waitee))

    def on_stream_sync(self, key) -> None:
        with _Held(self):
            self._model.synchronize_stream(self._stream(key), site=self._sync_site)

    def on_device_sync(self, device) -> None:
        with _Held(self):
            self._model.synchronize_device(device, site=self._sync_site)
