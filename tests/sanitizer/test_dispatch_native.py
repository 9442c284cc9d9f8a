"""_dispatch.c runs the common op itself (dispatch.py's _Mode, the native
``__torch_dispatch__``): the ops it takes skip the Python body, the others
reach it, and both ways give the same findings, the same report text (sites
included), the same warning location and the same state after an op fails."""
import re
import sys
import warnings

import pytest
import torch
from hypothesis import given, settings

from npu_lifetime import simdevice as sd
from npu_lifetime.sanitizer import LifetimeSanitizer, LifetimeWarning, dispatch, native
from npu_lifetime.sanitizer.hub import on_thread

if native.dispatch is None or native.scan is None or native.frames is None or native.op_feed is None:
    pytest.skip("the sanitizer's native parts are off or not built", allow_module_level=True)

from test_native_parity import STEPS, run_program  # noqa: E402

_BODY = dispatch._Mode.__dict__["__torch_dispatch__"]
_BODY = getattr(_BODY, "__wrapped__", _BODY).__code__


def _body_calls(program) -> int:
    """How often the Python body ran while ``program()`` ran."""
    calls = 0

    def count(frame, event, arg):
        nonlocal calls
        if event == "call" and frame.f_code is _BODY:
            calls += 1

    sys.setprofile(count)
    try:
        program()
    finally:
        sys.setprofile(None)
    return calls


@pytest.fixture
def body_only(monkeypatch):
    """Every op through the Python body (what the path is compared with)."""
    monkeypatch.setattr(dispatch, "_fast_path_state", lambda sanitizers: None)


def test_common_ops_skip_the_python_body():
    a, b = torch.ones(8), torch.ones(8)
    with LifetimeSanitizer("sim", on_race="collect"):
        assert _body_calls(lambda: (a + b, a.add_(b), (a @ a.view(8, 1)).relu(), a.t())) == 0


def test_other_ops_reach_the_python_body():
    """A resize, a batch norm in training: the body's."""
    a = torch.ones(8)
    norm = torch.nn.BatchNorm1d(4).train()
    with LifetimeSanitizer("sim", on_race="collect"):
        assert _body_calls(lambda: a.resize_(16)) == 1
        assert _body_calls(lambda: norm(torch.ones(2, 4))) >= 1


def test_the_body_only_fixture_sends_every_op_to_the_body(body_only):
    a, b = torch.ones(8), torch.ones(8)
    with LifetimeSanitizer("sim", on_race="collect"):
        assert _body_calls(lambda: a + b) == 1


@pytest.mark.parametrize("name", ["op_accesses", "plan", "written_storages"])
def test_a_test_that_replaces_a_part_of_the_scan_gets_the_body(monkeypatch, name):
    from npu_lifetime.sanitizer import accesses

    a, b = torch.ones(8), torch.ones(8)
    real = getattr(accesses, name)
    with LifetimeSanitizer("sim", on_race="collect"):
        monkeypatch.setattr(accesses, name, lambda *args, **kwargs: real(*args, **kwargs))
        assert _body_calls(lambda: a.add_(b)) == 1


def _full_reports(steps) -> list:
    """Whole reports, with what differs between any two runs taken out:
    addresses, the simulated streams' numbers, and whether the CPU
    allocator happened to reuse a freed storage's memory (a free's
    "ACTUAL" or "latent" and its "why latent" lines: seen to differ
    between two runs of one program on the GPU host)."""
    return sorted(_same_luck(re.sub(r"sim stream \d+", "sim stream N", re.sub(r"0x[0-9a-f]+", "0x_", text)))
                  for text in run_program(steps, whole_reports=True))


def _same_luck(report: str) -> str:
    report = report.replace("ACTUAL: a reuse race followed", "latent")
    return "\n".join(line for line in report.splitlines() if not line.startswith("  why latent:"))


@settings(max_examples=40, deadline=None)
@given(STEPS)
def test_random_programs_get_the_same_reports_both_ways(steps):
    native_path = _full_reports(steps)
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(dispatch, "_fast_path_state", lambda sanitizers: None)
        body = _full_reports(steps)
    assert _not_reuse(native_path) == _not_reuse(body)


def _not_reuse(reports: list) -> list:
    """A reuse race depends on where the CPU allocator put the memory in each run (test_native_parity)."""
    return [r for r in reports if "[reuse race" not in r]


def test_the_comparison_sees_a_path_that_drops_writes(monkeypatch):
    program = [("write", 1, 0), ("read", 0, 0), ("write", 2, 1), ("write", 0, 1)]
    right = _full_reports(program)
    real = dispatch._apply_parts

    def reads_only(sanitizer):
        parts = real(sanitizer)
        feed = parts["feed"]

        def dropping(found, *rest):
            for a in found:
                a.is_write = False
            return feed(found, *rest)

        parts["feed"] = dropping
        return parts

    monkeypatch.setattr(dispatch, "_apply_parts", reads_only)
    assert right and _full_reports(program) != right


def _race_warning():
    side = sd.Stream()
    with LifetimeSanitizer("sim", on_race="warn", warn_on_free=False):
        a = torch.ones(8)  # written on the default stream
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with sd.stream(side):
                a.add_(1)  # the racing write: a was written on the default stream
    races = [w for w in caught if issubclass(w.category, LifetimeWarning)]
    assert len(races) == 1, [str(w.message)[:200] for w in caught]
    return races[0]


def test_a_race_warning_names_the_programs_line(body_only):
    warned = _race_warning()
    assert (warned.filename, warned.lineno) == (__file__, _line_of("a.add_(1)  # the racing write"))


def test_a_race_warning_names_the_programs_line_on_the_native_path():
    warned = _race_warning()
    assert (warned.filename, warned.lineno) == (__file__, _line_of("a.add_(1)  # the racing write"))


def _line_of(text: str) -> int:
    with open(__file__) as source:
        return next(n for n, line in enumerate(source, 1) if text in line and "_line_of" not in line)


def test_a_failing_op_leaves_no_frame_and_raises_its_error():
    a, b = torch.ones(2), torch.ones(3)
    with LifetimeSanitizer("sim", on_race="collect") as san:
        with pytest.raises(RuntimeError, match="size of tensor"):
            a + b
        assert on_thread.frame is None
        (a * 2).sum()  # the sanitizer goes on
    assert not [f for f in san.flush() if not getattr(f, "live", False)]


def test_a_race_raises_from_the_native_path():
    side = sd.Stream()
    with LifetimeSanitizer("sim", on_race="raise", warn_on_free=False):
        a = torch.ones(8)
        with sd.stream(side):
            with pytest.raises(Exception, match="data race"):
                a.add_(1)
