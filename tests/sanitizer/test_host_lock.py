"""_host_lock.c's HostLock behaves as feeds.py's HostLock: reentrant,
and entering it from a thread that is not the model's host calls
``_set_host`` (with the lock held); if that fails, the lock is released."""
import threading
from _thread import RLock

import pytest

from npu_lifetime.sanitizer import native
from npu_lifetime.sanitizer.feeds import HostLock as PythonHostLock

KINDS = ["python"] + (["native"] if native.host_lock is not None else [])


class Owner:
    def __init__(self, fail: bool = False) -> None:
        self._host = threading.get_ident()
        self.calls = []
        self.fail = fail

    def _set_host(self):
        self.calls.append(threading.get_ident())
        if self.fail:
            raise RuntimeError("set_host failed")
        self._host = threading.get_ident()


def make(kind: str, owner: Owner):
    return native.host_lock.HostLock(RLock(), owner) if kind == "native" else PythonHostLock(RLock(), owner)


@pytest.mark.parametrize("kind", KINDS)
def test_another_thread_becomes_the_host_with_the_lock_held(kind):
    owner = Owner()
    lock = make(kind, owner)
    with lock:
        with lock:  # reentrant; the host does not change
            pass
    assert owner.calls == []

    def other():
        with lock:
            pass

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert owner.calls == [t.ident] and owner._host == t.ident
    with lock:  # back to this thread
        pass
    assert owner.calls == [t.ident, threading.get_ident()]


@pytest.mark.parametrize("kind", KINDS)
def test_a_failed_set_host_releases_the_lock(kind):
    owner = Owner(fail=True)
    owner._host = -1 & 0xFFFF  # not this thread
    lock = make(kind, owner)
    with pytest.raises(RuntimeError, match="set_host failed"):
        with lock:
            pass
    got = []
    t = threading.Thread(target=lambda: got.append(lock.acquire(blocking=False)))
    t.start()
    t.join()
    assert got == [True]  # free again: another thread takes it at once


def test_the_native_lock_is_built():
    if native.ENABLED and native.storage_feed is not None:
        assert native.host_lock is not None
