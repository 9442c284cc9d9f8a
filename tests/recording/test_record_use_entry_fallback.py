"""The native fallback's fast path in C (_entry.FallbackFast) against its
Python reference (calls.fallback_fast_path_reference), and the C entry
over it: on the same inputs, the same answer, the same calls into the
table and the same errors.  The table is a double that records what it is
given (the real tables have their own tests: test_torch_allocator_fallback*.py)."""
import re
import sys

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import npu_lifetime
from npu_lifetime.recording import calls
from npu_lifetime.shim import state as shim_state

pytestmark = pytest.mark.skipif(calls._entry is None, reason="the C entry is not built or NPU_LIFETIME_NATIVE=0")


class Table:
    """A table's fast(tensor, stream): records the call, answers ``answer``
    (or raises it, an exception class)."""

    def __init__(self, answer=True):
        self.calls, self.answer = [], answer

    def fast(self, tensor, stream):
        self.calls.append((id(tensor), stream))
        if isinstance(self.answer, type):  # an exception class: a fresh one each time (a reused one keeps tracebacks)
            raise self.answer("table failed")
        return self.answer


def current_stream_of(kind):
    def current(device):
        if kind == "raises RuntimeError":
            raise RuntimeError("no current stream")
        if kind == "raises AttributeError":
            raise AttributeError("no current stream")
        return f"current of {device}"
    return current


def outcome(call):
    try:
        return "done", call()
    except Exception as err:  # noqa: BLE001 - the outcome compared is the error itself
        return type(err).__name__, re.sub(r"0x[0-9a-f]+", "0x?", str(err))


TENSORS = {"cpu tensor": lambda: torch.ones(2), "not a tensor": lambda: [1, 2], "none": lambda: None}
STREAMS = {"explicit": "side", "None": None}
ANSWERS = {"True": True, "False": False, "raises": RuntimeError, "a number": 0}
CURRENT = ["works", "raises RuntimeError", "raises AttributeError"]


def both(make_fast, tensor_kind, stream, answer, current, installed, monkeypatch):
    """[(outcome, table calls)] of the C path, then the Python one."""
    monkeypatch.setattr(shim_state, "_installed", object() if installed else None)
    results = []
    for maker in (calls.fallback_fast_path, calls.fallback_fast_path_reference):
        table, tensor = Table(answer), TENSORS[tensor_kind]()
        fast = maker(table.fast, "is_cpu", current_stream_of(current))
        results.append((outcome(lambda: make_fast(fast, tensor, stream)), [s for _, s in table.calls]))
    return results


def call_fast(fast, tensor, stream):
    return fast(tensor, stream)


def call_entry(fast, tensor, stream):
    """The C entry with ``fast`` as the active fast path; the checked path
    stubbed (it is the same Python for both)."""
    saved = calls._fast, calls._record_use_checked
    checked = []
    calls._fast, calls._record_use_checked = fast, lambda t, s: checked.append(s)
    try:
        entry = calls.record_use if isinstance(fast, calls._entry.FallbackFast) else calls.record_use_reference
        entry(tensor, stream)
    finally:
        calls._fast, calls._record_use_checked = saved
    return checked


@given(st.sampled_from(sorted(TENSORS)), st.sampled_from(sorted(STREAMS)), st.sampled_from(sorted(ANSWERS)),
       st.sampled_from(CURRENT), st.booleans(), st.sampled_from([call_fast, call_entry]))
def test_the_c_fallback_fast_path_does_what_the_reference_does(tensor_kind, stream_kind, answer, current,
                                                                installed, how):
    with pytest.MonkeyPatch.context() as monkeypatch:
        native, reference = both(how, tensor_kind, STREAMS[stream_kind], ANSWERS[answer], current, installed,
                                 monkeypatch)
    assert native == reference


def test_it_is_marked_a_fallback_path():
    fast = calls.fallback_fast_path(Table().fast, "is_cpu", current_stream_of("works"))
    assert type(fast).__name__ == "FallbackFast" and fast.fallback is True


def test_it_steps_aside_under_a_dispatch_mode():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Watching(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    table = Table()
    fast = calls.fallback_fast_path(table.fast, "is_cpu", current_stream_of("works"))
    with Watching():
        assert fast(torch.ones(2), "side") is False
    assert fast(torch.ones(2), "side") is True and len(table.calls) == 1


def test_no_reference_is_leaked_on_any_path(monkeypatch):
    monkeypatch.setattr(shim_state, "_installed", None)
    x, side = torch.ones(2), object()
    cases = [(Table(True), x, side), (Table(True), x, None), (Table(RuntimeError), x, side),
             (Table(True), [1], None)]
    before = [(sys.getrefcount(t), sys.getrefcount(s)) for _, t, s in cases]
    for _ in range(200):
        for table, t, s in cases:
            fast = calls.fallback_fast_path(table.fast, "is_cpu", current_stream_of("works"))
            outcome(lambda: call_entry(fast, t, s))  # noqa: B023 - called at once
            table.calls.clear()
    del t, s, table, fast  # the loop's last case
    assert [(sys.getrefcount(t), sys.getrefcount(s)) for _, t, s in cases] == before


def test_bad_constructor_arguments_are_refused():
    with pytest.raises(TypeError):
        calls._entry.FallbackFast(None, "is_cpu", len, int, shim_state)
    with pytest.raises(TypeError):
        calls._entry.FallbackFast(len, b"is_cpu", len, int, shim_state)


def test_the_entry_records_through_it_eagerly(monkeypatch):
    table = Table()
    monkeypatch.setattr(calls, "_fast", calls.fallback_fast_path(table.fast, "is_cpu", current_stream_of("works")))
    monkeypatch.setattr(shim_state, "_installed", None)
    npu_lifetime.record_use(torch.ones(2))
    assert [s for _, s in table.calls] == ["current of cpu"]
