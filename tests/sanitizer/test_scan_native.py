"""The native scan of an op's tensor arguments (_scan.c) against the
Python rules it replaces (accesses._note_all), on every op call of torch's
OpInfo samples: the same storages, in the same order, with the same
read/write/fresh verdicts and argument names."""
import os

import pytest

from npu_lifetime.sanitizer import native
import torch

from npu_lifetime.sanitizer import accesses

pytest.importorskip("numpy", reason="torch's op_db needs numpy (the test extras install it)")
pytest.importorskip("expecttest", reason="torch's op_db needs expecttest (the test extras install it)")

if native.scan is None:
    if (os.environ.get("CI") == "true" and native.ENABLED):
        raise AssertionError("npu_lifetime.sanitizer._scan is not built: setup.py must build it in CI")
    pytest.skip("npu_lifetime.sanitizer._scan is not built (python setup.py build_ext --inplace)",
                allow_module_level=True)

from helpers import frontend_reference as reference  # noqa: E402


def _verdicts(found: list) -> list:
    return [(a.storage, a.is_write, a.fresh, a.accessed, a.device_index, list(a.names), a.tensor is not None)
            for a in found]


def _both_ways(monkeypatch, native_scan=native.scan):
    """op_accesses that runs the native scan (``Parts.scan``) and the Python
    one on each call and keeps every difference."""
    original = accesses.op_accesses
    calls, differences = [], []

    def compare(func, args, kwargs, outputs, tracked, p=None, written_before=None, scan=None):
        native = original(func, args, kwargs, outputs, tracked, p, written_before, native_scan)
        python = original(func, args, kwargs, outputs, tracked, p, written_before, accesses.PythonScan)
        calls.append(func)
        if _verdicts(native) != _verdicts(python):
            differences.append((str(func), _verdicts(native), _verdicts(python)))
        return native

    monkeypatch.setattr(accesses, "op_accesses", compare)
    written = accesses.written_storages

    def compare_written(p, args, kwargs, scan=None):
        """written_storages both ways (the dispatch body calls it before an op that writes)."""
        native = written(p, args, kwargs, native_scan)
        python = written(p, args, kwargs, accesses.PythonScan)
        calls.append(("written", p.name))
        if [(id(t), address) for t, address in native] != [(id(t), address) for t, address in python]:
            differences.append((f"written_storages of {p.name}", native, python))
        return native

    monkeypatch.setattr(accesses, "written_storages", compare_written)
    return calls, differences


def test_the_native_scan_gives_the_python_verdicts_on_op_db(monkeypatch):
    calls, differences = _both_ways(monkeypatch)
    survey = reference.survey_op_db(samples_per_op=1)
    ops = [c for c in calls if not isinstance(c, tuple)]
    assert len(ops) > 1500 and len({str(f) for f in ops}) > 500, survey.summary()
    assert len({c for c in calls if isinstance(c, tuple)}) > 100, "few written_storages calls compared"
    assert not differences, "\n".join(f"{op}: native {n} python {p}" for op, n, p in differences[:10])


def test_the_comparison_sees_a_wrong_scan(monkeypatch):
    """The comparison can fail: a scan that calls every read a write."""
    class Wrong:
        written = staticmethod(native.scan.written)

        @staticmethod
        def op(arguments, *rest):
            return native.scan.op(tuple((i, name, True) for i, name, _ in arguments), *rest)

    calls, differences = _both_ways(monkeypatch, Wrong)
    accesses.op_accesses(torch.ops.aten.add.Tensor, (torch.ones(2), torch.ones(2)), {}, torch.ones(2),
                         lambda t: True)
    assert calls and differences


def test_lists_of_tensors_give_the_python_verdicts(monkeypatch):
    """foreach ops (an optimizer's step) and cat take lists: walked natively."""
    calls, differences = _both_ways(monkeypatch)
    aten = torch.ops.aten
    xs, ys = [torch.ones(3) for _ in range(4)], [torch.ones(3) for _ in range(4)]
    shared = torch.ones(3)
    for func, args in [
        (aten._foreach_add_.List, (xs, ys)),
        (aten._foreach_mul.Scalar, (xs, 2.0)),
        (aten._foreach_addcmul_.Scalar, (xs, ys, [shared, shared, shared, shared])),
        (aten.cat.default, ([xs[0], xs[0][1:], ys[1]],)),
        (aten.stack.default, ((xs[0], ys[0]),)),
    ]:
        outputs = func(*args)
        accesses.op_accesses(func, args, {}, outputs, lambda t: t.is_cpu)
    assert len(calls) == 5
    assert not differences, differences
