"""Every host thread's ops reach the sanitizer.

torch keeps the dispatch-mode stack per thread: the mode that ``enable()``
enters is on the enabling thread's stack only.  While a sanitizer is
enabled, every other thread pushes the same mode on its own stack
(``dispatch.follow_this_thread``):

- a thread started later, from Python (``Thread.start``: thread pools and
  DataLoader's pin-memory thread are such threads), when it starts to run;
- a thread already running, at its next Python event: a one-shot profile
  function set on each of them (``RunningThreads``, the Python reference:
  ``sys._setprofileallthreads``, half of
  ``threading.setprofile_all_threads``, which replaces other threads'
  profile functions; the C one, ``Parts.running_threads``, keeps the
  profile function the thread had).  Without either (the pure-Python
  sanitizer on 3.11), threads already running are not followed:
  ``following_running_threads`` says so.

A thread that took the mode keeps it after ``disable()``: with no sanitizer
enabled it passes every op through untouched.  Threads started from C++
(autograd's engine, a backend's workers) inherit the mode from the thread
that handed them work, as torch propagates its thread-local state.
"""
from __future__ import annotations

import sys
import threading
from typing import Callable


class RunningThreads:
    """Threads already running when a sanitizer is enabled, followed in
    Python (the C one, ``native.py``'s, has the same three functions)."""

    @staticmethod
    def following_running_threads() -> bool:
        """Whether threads already running when a sanitizer is enabled are followed."""
        return hasattr(sys, "_setprofileallthreads")

    @staticmethod
    def follow_running(enter: Callable[[], None]) -> None:
        """Arms every other running thread to call ``enter()`` at its next Python event."""
        if not hasattr(sys, "_setprofileallthreads"):  # CPython 3.12+ (threading.setprofile_all_threads' half)
            return
        mine = sys.getprofile()

        def one_shot(frame, event, arg):
            sys.setprofile(None)
            enter()

        sys._setprofileallthreads(one_shot)  # running threads only: Thread.start takes care of later ones
        sys.setprofile(mine)  # this thread follows already, and its profiler stays its own

    @staticmethod
    def stop_following() -> None:
        """Disarms the running threads that have not taken the mode yet
        (nothing to do: the one-shot profile functions stay armed)."""


def wrap_start(thread: threading.Thread, enter: Callable[[], None]) -> None:
    """``thread`` (not started yet) calls ``enter()`` first when it runs."""
    run = thread.run

    def run_followed(*args, **kwargs):
        enter()
        return run(*args, **kwargs)

    thread.run = run_followed
