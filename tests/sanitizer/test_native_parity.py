"""The sanitizer with its native parts (the stack walk, the scan, the feed,
the C++ model: npu_lifetime/sanitizer/native.py) gives the verdicts of the
pure-Python sanitizer: on random stream programs run twice in-process.  The
sanitizer's own test files run both ways too (conftest.py's ``both_ways``)."""
import gc
import os
import threading
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import npu_lifetime
from npu_lifetime import lifetime
from npu_lifetime import simdevice as sd
from npu_lifetime.sanitizer import LifetimeSanitizer, native

from helpers.by_chance import not_by_chance
from conftest import python_everywhere

ROOT = Path(__file__).resolve().parents[2]

if not native.ENABLED or native.op_feed is None or native.scan is None or lifetime.NativeLifetimeModel is None:
    if os.environ.get("CI") == "true" and native.ENABLED:
        raise AssertionError("the sanitizer's native parts are not built: setup.py must build them in CI")
    pytest.skip("the sanitizer's native parts are off or not built", allow_module_level=True)

# a step: (kind, stream index, tensor index); kinds read, write, new, free, wait, use, and (issue 36)
# the step after it on a worker thread, an op that raises inside, a sparse tensor, a torch.func transform
KINDS = ["read", "write", "new", "free", "wait", "record_use", "sync", "thread", "raise", "sparse", "func"]
STEPS = st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 2), st.integers(0, 3)), min_size=1, max_size=25)
EXAMPLES = int(os.environ.get("NPL_PARITY_EXAMPLES", "40"))


def run_program(steps, whole_reports: bool = False, parts=None) -> list:
    """The program on the simulated device under a fresh sanitizer; its
    findings, as comparable text (each one's first report line, or its
    whole report: sites and fixes)."""
    san = LifetimeSanitizer("sim", on_race="collect", warn_on_free=False, parts=parts)
    with san:
        streams = [sd.default_stream(), sd.Stream(), sd.Stream()]
        tensors = [torch.ones(16) for _ in range(4)]
        on_thread = False
        for kind, s, t in steps:
            if kind == "thread":
                on_thread = True
                continue
            if on_thread:
                on_thread = False
                worker = threading.Thread(target=_step, args=(streams, tensors, kind, s, t))
                worker.start()
                worker.join()
            else:
                _step(streams, tensors, kind, s, t)
        del tensors
        gc.collect()
    if whole_reports:
        return sorted(san.report([f]) for f in san.flush())
    return sorted(f"{f.kind}: {san.report([f]).splitlines()[0]}" for f in san.flush())


def _step(streams, tensors, kind, s, t) -> None:
    stream = streams[s]
    with sd.stream(stream):
        if kind == "read":
            tensors[t].sum()
        elif kind == "write":
            tensors[t].add_(1)
        elif kind == "new":
            tensors[t] = tensors[(t + 1) % 4] * 2
        elif kind == "free":
            tensors[t] = torch.zeros(16)
        elif kind == "wait":
            stream.wait_stream(streams[(s + 1) % 3])
        elif kind == "record_use":
            npu_lifetime.record_use(tensors[t], stream)
        elif kind == "sync":
            streams[(s + 1) % 3].synchronize()
        elif kind == "raise":
            try:
                tensors[t] + torch.ones(3)  # shapes that do not broadcast: raises inside the op
            except RuntimeError:
                pass
        elif kind == "sparse":
            tensors[t] = (tensors[t].reshape(4, 4).to_sparse() * 2).to_dense().reshape(16)
        elif kind == "func":
            tensors[t] = torch.func.grad(lambda x: (x * x).sum())(tensors[(t + 1) % 4])


@settings(max_examples=EXAMPLES, deadline=None)
@given(STEPS)
def test_random_programs_get_the_same_findings_both_ways(steps):
    with pytest.MonkeyPatch.context() as monkeypatch:
        in_use = native.in_use()
        del in_use["trace_bridge"]  # CUDA's, installed by the first CUDA sanitizer (test_trace_bridge.py)
        assert in_use == {"frames": True, "scan": True, "feed": True, "dispatch": True, "storage_feed": True,
                                   "trace_hook": True, "host_lock": True, "event_hook": True,
                                   "event_feed": True, "threads": True, "model": True}
        with_native = run_program(steps)
        python_everywhere(monkeypatch)
        assert native.default().model is lifetime.LifetimeModel
        pure = run_program(steps)
    assert not_by_chance(with_native) == not_by_chance(pure)


def test_the_programs_make_findings():
    """The comparison above compares something: a racy program is found."""
    found = run_program([("write", 1, 0), ("read", 0, 0), ("free", 1, 0)])
    assert any(line.startswith("data_race") or "race" in line for line in found), found


def test_the_comparison_sees_a_wrong_feed(monkeypatch):
    """A feed that drops every write changes the findings of a racy program."""
    program = [("write", 1, 0), ("read", 0, 0), ("write", 2, 1), ("write", 0, 1)]
    right = run_program(program)
    parts = native.native_parts()

    def reads_only(found, *rest):
        for a in found:
            a.is_write = False
        return native.op_feed.feed(found, *rest)

    wrong = parts.replace(name="reads only", op_feed=reads_only)
    assert run_program(program, parts=wrong) != right
