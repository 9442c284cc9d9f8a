"""Fault injection at the seam between the sanitizer's C parts and Python
(issue 36, item 1): in turn, each Python callable the native parts call
(the model's methods, the sanitizer's own helpers, the backend's hooks, the
dispatch helpers) raises.  The program must see that error, or it is
reported as unraisable where the device gives it no caller (a free), and
never a SystemError.  This file also runs with every native part off
(tests/sanitizer/test_native_parity.py), so the Python reference is held to the same.
"""
import gc
import sys
import threading

import pytest
import torch

from npu_lifetime import simdevice as sd
from npu_lifetime.sanitizer import DataRaceError, LifetimeSanitizer, dispatch, native
from npu_lifetime.sanitizer.backends import SimBackend

pytestmark = pytest.mark.usefixtures("both_ways")  # conftest.py: C parts, then Python's


class Boom(Exception):
    pass


def program():
    """Allocation, a cross-stream hand-off through an event, a host wait,
    frees, then a data race: every path of the feeds."""
    side = sd.Stream()
    x = torch.ones(64)
    done = sd.Event()
    done.record()
    side.wait_event(done)
    with sd.stream(side):
        y = x * 2
    side.synchronize()
    z = y + 1
    del x, y
    gc.collect()
    sd.synchronize()
    worker = threading.Thread(target=lambda: torch.ones(4).add_(1))  # an op on another host thread
    worker.start()
    worker.join()
    a = torch.ones(8)
    with sd.stream(side):
        _ = a + 1  # reads a, written on the default stream, with no wait: a race
    return z


MODEL_METHODS = ["allocate", "access", "free", "has_stream", "create_stream", "create_event", "record_event",
                 "wait_event", "synchronize_stream", "synchronize_device"]
SANITIZER_METHODS = ["_stream", "_first_sight", "_announce_races", "_free_found", "_set_host"]
BACKEND_HOOKS = ["before_op", "inside_op", "current_stream"]
DISPATCH_HELPERS = ["_fast_path_state"]  # called at enable: a failure there leaves nothing enabled


class _Hits:
    count = 0


def _raising(name, hits):
    def boom(*args, **kwargs):
        hits.count += 1
        raise Boom(name)

    return boom


class _FaultyModel:
    """The real model, except that ``name`` raises."""

    def __init__(self, real, name, hits):
        self._real, self._name, self._hits = real, name, hits

    def __getattr__(self, attr):
        if attr == self._name:
            return _raising(attr, self._hits)
        return getattr(self._real, attr)


def _run_collecting(make_sanitizer):
    """Runs the program; returns (what it raised, what was reported as unraisable)."""
    unraisable = []
    old_hook = sys.unraisablehook
    sys.unraisablehook = lambda u: unraisable.append(u.exc_value)
    raised = None
    san = make_sanitizer()
    try:
        with san:
            program()
    except BaseException as error:  # noqa: BLE001  (what the program sees)
        raised = error
    finally:
        san.disable()
        gc.collect()
        sys.unraisablehook = old_hook
    return raised, unraisable


def _check(raised, unraisable, hits):
    seen = ([raised] if raised is not None else []) + unraisable
    assert hits.count > 0, "the fault was never reached: the test would prove nothing"
    assert not any(isinstance(e, SystemError) for e in seen), seen
    assert any(isinstance(e, Boom) for e in seen), seen
    # nothing is left behind: the next op, with no sanitizer, runs
    assert float((torch.ones(2) + 1).sum()) == 4.0
    assert dispatch.active() == ()


@pytest.mark.parametrize("name", MODEL_METHODS)
def test_a_model_method_that_raises_reaches_the_program(monkeypatch, name):
    hits = _Hits()
    parts = native.default()
    faulty = parts.replace(model=lambda *a, **k: _FaultyModel(parts.model(*a, **k), name, hits))
    raised, unraisable = _run_collecting(lambda: LifetimeSanitizer("sim", warn_on_free=False, parts=faulty))
    _check(raised, unraisable, hits)


@pytest.mark.parametrize("name", SANITIZER_METHODS)
def test_a_sanitizer_helper_that_raises_reaches_the_program(name):
    hits = _Hits()
    faulty = type("Faulty", (LifetimeSanitizer,), {name: _raising(name, hits)})
    raised, unraisable = _run_collecting(lambda: faulty("sim", warn_on_free=False))
    _check(raised, unraisable, hits)


@pytest.mark.parametrize("name", BACKEND_HOOKS)
def test_a_backend_hook_that_raises_reaches_the_program(monkeypatch, name):
    hits = _Hits()
    monkeypatch.setattr(SimBackend, name, _raising(name, hits))
    raised, unraisable = _run_collecting(lambda: LifetimeSanitizer("sim", warn_on_free=False))
    _check(raised, unraisable, hits)


@pytest.mark.parametrize("name", DISPATCH_HELPERS)
def test_a_dispatch_helper_that_raises_reaches_the_program(monkeypatch, name):
    if native.dispatch is None:
        pytest.skip("the C dispatcher's state is made only where it was built")
    hits = _Hits()
    monkeypatch.setattr(dispatch, name, _raising(name, hits))
    raised, unraisable = _run_collecting(lambda: LifetimeSanitizer("sim", warn_on_free=False))
    _check(raised, unraisable, hits)


def test_without_a_fault_the_program_raises_its_race():
    """The program above is a real check: unharmed, the default raise names its race."""
    raised, unraisable = _run_collecting(lambda: LifetimeSanitizer("sim", warn_on_free=False))
    assert isinstance(raised, DataRaceError), raised
    assert unraisable == []
