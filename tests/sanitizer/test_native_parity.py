"""The sanitizer with its native parts (the stack walk, the scan, the feed,
the C++ model: npu_lifetime/sanitizer/native.py) gives the verdicts of the
pure-Python sanitizer: on random stream programs run twice in-process, and on
the sanitizer's own test files run with ``NPU_LIFETIME_NATIVE=0``."""
import gc
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import npu_lifetime
from npu_lifetime import lifetime
from npu_lifetime import simdevice as sd
from npu_lifetime.sanitizer import LifetimeSanitizer, accesses, native, sites, threads

from helpers.by_chance import not_by_chance

ROOT = Path(__file__).resolve().parents[2]

if not native.ENABLED or native.feed is None or native.scan is None or lifetime.NativeLifetimeModel is None:
    if os.environ.get("CI") == "true" and native.ENABLED:
        raise AssertionError("the sanitizer's native parts are not built: setup.py must build them in CI")
    pytest.skip("the sanitizer's native parts are off or not built", allow_module_level=True)

# a step: (kind, stream index, tensor index); kinds read, write, new, free, wait, use, and (issue 36)
# the step after it on a worker thread, an op that raises inside, a sparse tensor, a torch.func transform
KINDS = ["read", "write", "new", "free", "wait", "record_use", "sync", "thread", "raise", "sparse", "func"]
STEPS = st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 2), st.integers(0, 3)), min_size=1, max_size=25)
EXAMPLES = int(os.environ.get("NPL_PARITY_EXAMPLES", "40"))


def run_program(steps, whole_reports: bool = False) -> list:
    """The program on the simulated device under a fresh sanitizer; its
    findings, as comparable text (each one's first report line, or its
    whole report: sites and fixes)."""
    san = LifetimeSanitizer("sim", on_race="collect", warn_on_free=False)
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


def _python_only(monkeypatch) -> None:
    monkeypatch.setattr(native, "feed", None)
    monkeypatch.setattr(native, "storage_feed", None)
    monkeypatch.setattr(native, "trace_hook", None)
    monkeypatch.setattr(native, "host_lock", None)
    monkeypatch.setattr(native, "event_feed", None)
    monkeypatch.setattr(native, "event_hook", None)  # hubs' subscribers made from now on (the sim's listener
    # is made once per process: tests/sanitizer/test_event_hook.py compares its two paths)
    monkeypatch.setattr(accesses, "_native_scan", None)
    monkeypatch.setattr(sites, "_native_frames", None)
    monkeypatch.setattr(native, "ENABLED", False)  # model_class(): model.py's
    monkeypatch.setattr(threads, "_native", None)  # threads running at enable(): sys._setprofileallthreads or none


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
        _python_only(monkeypatch)
        assert native.model_class() is lifetime.LifetimeModel
        pure = run_program(steps)
    assert not_by_chance(with_native) == not_by_chance(pure)


def test_the_programs_make_findings():
    """The comparison above compares something: a racy program is found."""
    found = run_program([("write", 1, 0), ("read", 0, 0), ("free", 1, 0)])
    assert any(line.startswith("data_race") or "race" in line for line in found), found


def test_the_sanitizer_test_files_pass_without_the_native_parts():
    files = sorted(str(p) for p in (ROOT / "tests" / "sanitizer").glob("test_sanitizer_*.py"))
    files += [str(ROOT / "tests" / "recording" / name) for name in ("test_handoff.py", "test_fsdp2_migration.py")]
    assert len(files) >= 12 and all(map(os.path.exists, files)), files  # a moved file must not drop out unseen
    env = dict(os.environ, NPU_LIFETIME_NATIVE="0")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *files],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout.splitlines()[-1]


def test_the_comparison_sees_a_wrong_feed(monkeypatch):
    """A feed that drops every write changes the findings of a racy program."""
    program = [("write", 1, 0), ("read", 0, 0), ("write", 2, 1), ("write", 0, 1)]
    right = run_program(program)
    real = native.feed

    class ReadsOnly:
        @staticmethod
        def feed(found, *rest):
            for a in found:
                a.is_write = False
            return real.feed(found, *rest)

    monkeypatch.setattr(native, "feed", ReadsOnly)
    assert run_program(program) != right
