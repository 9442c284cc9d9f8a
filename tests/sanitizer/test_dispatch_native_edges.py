"""Edge cases of the native dispatch path and _scan.written, each found by a
review of them (helper-31) and failing before its fix:

- _scan.written on a plain tensor subclass (not a wrapper subclass) recursed
  without end through accesses._tensors and the process died (SIGSEGV), so
  those cases run in a child process;
- an op that raises, then the replay of its held events raising too: the
  native path returned NULL with no exception set (SystemError), where the
  body raises the replay's error with the op's as its context."""
import os
import subprocess
import sys
import textwrap

import pytest

from npu_lifetime.sanitizer import native

if native.scan is None:
    pytest.skip("the native scan is not built", allow_module_level=True)


def _run(code: str) -> subprocess.CompletedProcess:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's package
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=300, cwd=root, env=env)


def test_native_written_matches_the_python_loop_on_a_tensor_subclass():
    done = _run("""
        import torch
        from npu_lifetime.sanitizer import accesses, native

        class Sub(torch.Tensor):
            pass

        x = torch.ones(4).as_subclass(Sub)
        p = accesses.plan(torch.ops.aten.add_.Tensor)
        expected = accesses.written_storages(p, (x, torch.ones(4)), {})  # the Python loop
        got = native.scan.written(p.arguments, (x, torch.ones(4)), {})
        assert [(t is x, a) for t, a in got] == [(t is x, a) for t, a in expected], (got, expected)
        print("ok")
    """)
    assert done.returncode == 0 and "ok" in done.stdout, (done.returncode, done.stderr[-2000:])


def test_an_in_place_op_on_a_tensor_subclass_under_the_sanitizer():
    """x.add_(1) on a torch.Tensor subclass (or a Parameter subclass, as some libraries
    quantised parameters are): the native path and the Python body both call _scan.written."""
    done = _run("""
        import torch
        from npu_lifetime.sanitizer import LifetimeSanitizer

        class Sub(torch.Tensor):
            pass

        class Param(torch.nn.Parameter):
            pass

        x = torch.ones(4).as_subclass(Sub)
        w = Param(torch.ones(4), requires_grad=False)
        with LifetimeSanitizer("sim", on_race="collect"):
            x.add_(1)
            w.mul_(2)
            torch._foreach_add_([x, torch.ones(4)], 1)
        print("ok")
    """)
    assert done.returncode == 0 and "ok" in done.stdout, (done.returncode, done.stderr[-2000:])


def _replay_failure(monkeypatch, body: bool, op=None):
    """An op that raises, then replaying its held events raises too: what reaches the program."""
    import torch

    from npu_lifetime.sanitizer import LifetimeSanitizer, dispatch

    if body:
        monkeypatch.setattr(dispatch, "_fast_path_state", lambda sanitizers: None)

    def replay_fails(frame):
        raise KeyError("replay")

    monkeypatch.setattr(dispatch, "_replay_held", replay_fails)  # before enabling: the native state holds it
    a, wrong = torch.ones(8), torch.ones(3)
    with LifetimeSanitizer("sim", on_race="collect"):
        with pytest.raises(BaseException) as raised:
            if op is None:
                a.add_(wrong)  # a size mismatch: torch sets the error from C++, not normalized on 3.11
            else:
                op(a, wrong)
    error = raised.value
    context = error.__context__
    return type(error), type(context), getattr(context, "__traceback__", None) is not None


def test_a_failing_replay_after_a_failing_op_raises_as_the_body_does(monkeypatch):
    native_result = _replay_failure(monkeypatch, body=False)
    monkeypatch.undo()
    body_result = _replay_failure(monkeypatch, body=True)
    assert body_result == (KeyError, RuntimeError, True)
    # the same chain; the native path calls the op's C++ binding (dispatch._op_binding), so torch's
    # error has no Python frame to carry a traceback (the body's has OpOverload.__call__'s)
    assert native_result == (KeyError, RuntimeError, False)


def test_a_failing_replay_after_an_op_failing_in_python_keeps_its_traceback_as_the_body_does(monkeypatch):
    """An op whose kernel is Python raises with a traceback: the native path keeps it."""
    import torch

    @torch.library.custom_op("npl_edges::fails", mutates_args=("x",))
    def fails(x: torch.Tensor) -> None:
        raise RuntimeError("the kernel failed")

    def failure(body: bool):
        return _replay_failure(monkeypatch, body, op=lambda a, wrong: torch.ops.npl_edges.fails(a))

    native_result = failure(body=False)
    monkeypatch.undo()
    assert native_result == failure(body=True) == (KeyError, RuntimeError, True)


def test_the_native_path_runs_an_op_by_its_binding_only_where_call_just_forwards(monkeypatch):
    import torch

    from npu_lifetime.sanitizer import LifetimeSanitizer, native
    from npu_lifetime.sanitizer.dispatch import _op_binding

    add = torch.ops.aten.add.Tensor
    assert _op_binding(add) is add._op  # torch's __call__ is `return self._op(*args, **kwargs)`
    assert _op_binding(torch.ops.higher_order.cond) is torch.ops.higher_order.cond  # not an OpOverload
    a = torch.ones(2)
    with LifetimeSanitizer("sim", on_race="collect"):
        a.add_(1)  # aten.add_.Tensor planned, its binding chosen, before any patch
    calls = []

    def counting_call(self, /, *args, **kwargs):  # a __call__ that does more than forward
        calls.append(self)
        return self._op(*args, **kwargs)

    def reversing_call(self, /, *args, **kwargs):  # the same names, other bytecode
        return self._op(*args[::-1], **kwargs)

    monkeypatch.setattr(torch._ops.OpOverload, "__call__", reversing_call)
    assert _op_binding(add) is add
    monkeypatch.setattr(torch._ops.OpOverload, "__call__", counting_call)
    assert _op_binding(add) is add  # not bypassed: its own __call__ runs
    with LifetimeSanitizer("sim", on_race="collect"):
        a.add_(1)  # planned before the patch: the patched __call__ runs all the same
        a.mul_(2)  # planned after it
    if native.dispatch is not None:
        assert calls == [torch.ops.aten.add_.Tensor, torch.ops.aten.mul_.Tensor], calls
    assert a.tolist() == [6.0, 6.0]
