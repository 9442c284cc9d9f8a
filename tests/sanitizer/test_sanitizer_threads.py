"""Every host thread is followed (issue 36, item 2): torch keeps the
dispatch-mode stack per thread, and ops made entirely inside a worker
thread were never seen.  Each body here makes a data race and an uncovered
free; on the main thread both are found, and so they must be from a thread
started after enable(), one already running at enable(), thread pools, and
one a library starts; nothing is seen after disable()."""
import concurrent.futures
import gc
import threading

import pytest
import torch

from npu_lifetime import simdevice as sd
from npu_lifetime.sanitizer import native
from helpers.collecting import sanitizer
from helpers.stream_devices import used_on_side

pytestmark = pytest.mark.usefixtures("both_ways")  # conftest.py: C parts, then Python's


def racy_body():
    """A read on a side stream of x, written on the default stream with no
    wait (a data race), and x freed with that use uncovered."""
    side = sd.Stream()
    x = torch.ones(64)
    with sd.stream(side):
        y = x + 1
    del x
    gc.collect()
    return y


def waiting_worker():
    """A thread (not started) that runs racy_body once ``go`` is set, then sets ``done``."""
    go, done = threading.Event(), threading.Event()

    def worker():
        go.wait()
        racy_body()
        done.set()

    return threading.Thread(target=worker), go, done


def kinds(san):
    return sorted({f.kind for f in san.flush()})


EXPECTED = ["data_race", "uncovered_free"]


def test_on_the_main_thread_the_body_is_caught():
    with sanitizer() as san:
        racy_body()
    assert kinds(san) == EXPECTED


def test_a_thread_started_after_enable_is_followed():
    with sanitizer() as san:
        worker = threading.Thread(target=racy_body)
        worker.start()
        worker.join()
    assert kinds(san) == EXPECTED


def test_a_thread_running_before_enable_is_followed():
    if not native.default().running_threads.following_running_threads():  # asked at run time: both_ways' parts
        pytest.skip("threads already running are followed by _threads.c (CPython 3.11/3.12) or "
                    "sys._setprofileallthreads (3.12+); the pure-Python sanitizer on 3.11 has neither")
    thread, go, done = waiting_worker()
    thread.start()  # before the sanitizer exists
    with sanitizer() as san:
        go.set()
        assert done.wait(30)
    thread.join()
    assert kinds(san) == EXPECTED


def test_a_thread_pool_is_followed():
    with sanitizer() as san:
        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
            list(pool.map(lambda _: racy_body(), range(2)))
    assert kinds(san) == EXPECTED


def test_a_pool_made_before_enable_is_followed():
    if not native.default().running_threads.following_running_threads():
        pytest.skip("see test_a_thread_running_before_enable")
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    pool.submit(lambda: None).result()  # its worker thread runs, idle, before the sanitizer exists
    try:
        with sanitizer() as san:
            pool.submit(racy_body).result()
    finally:
        pool.shutdown()
    assert kinds(san) == EXPECTED


def test_a_thread_torch_starts_from_python_is_followed():
    """DataLoader's pin-memory thread is a threading.Thread that torch starts
    (it runs only with workers and an accelerator): a Thread made and
    started inside library code is followed as the program's own are."""
    def library_code():
        thread = threading.Thread(target=racy_body, daemon=True, name="pin_memory_like")
        thread.start()
        return thread

    with sanitizer() as san:
        library_code().join()
    assert kinds(san) == EXPECTED


def test_nothing_is_seen_after_disable():
    san = sanitizer()
    with san:
        warm = threading.Thread(target=lambda: torch.ones(2) + 1)  # this thread takes the mode
        warm.start()
        warm.join()
    thread, go, done = waiting_worker()
    with san:
        thread.start()  # takes the mode while enabled
    go.set()  # ... and runs after disable()
    assert done.wait(30)
    thread.join()
    assert san.flush() == []


def test_per_thread_host_clocks_keep_their_meaning():
    """A host wait on one thread covers nothing another thread frees: the
    worker synchronises, the main thread frees without waiting."""
    with sanitizer() as san:
        x, side = used_on_side(16, use=lambda x: x.mul_(2))
        waiter = threading.Thread(target=side.synchronize)
        waiter.start()  # joined only after the free: the main thread never learns of the wait
        del x
        gc.collect()
        waiter.join()
    assert "uncovered_free" in kinds(san)


def test_the_new_checks_see_a_worker_threads_ops_too():
    """This session's checks from a worker thread: a sparse tensor's race (its
    holders) and a read-back by .to("cpu") (a patched method, not an op)."""
    def body():
        side = sd.Stream()
        s = torch.randn(4, 4).to_sparse()
        x = torch.ones(8)
        with sd.stream(side):
            s.to_dense()  # reads s's indices and values, written on the default stream: a race
            x.to("cpu")  # a read-back of x, no wait: a race
        return s, x

    with sanitizer() as san:
        worker = threading.Thread(target=body)
        worker.start()
        worker.join()
    found = [f for f in san.flush() if f.kind == "data_race"]
    ops = {f.access.op for f in found}
    assert "aten::to_dense" in ops or "aten::_to_dense" in ops, ops
    assert "Tensor.to" in ops, ops
