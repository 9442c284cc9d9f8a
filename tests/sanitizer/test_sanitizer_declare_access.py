"""declare_access: an access no op shows (a library handed the raw pointer)
stated to the sanitizer, which then treats it as an op's access."""
import ctypes

import pytest
import torch

from npu_lifetime import simdevice as sd
from npu_lifetime.recording import record_use
from npu_lifetime.sanitizer import DataRaceError, LifetimeSanitizer, declare_access

pytestmark = pytest.mark.usefixtures("both_ways")  # conftest.py: C parts, then Python's


def _raw_write_then_free(san_options, record):
    side = sd.Stream()
    with LifetimeSanitizer("sim", **san_options) as san:
        ws = torch.empty(4096, dtype=torch.uint8)
        side.wait_stream(sd.current_stream())
        with sd.stream(side):
            ctypes.memset(ws.data_ptr(), 7, ws.numel())  # the library's write: no op
            declare_access(ws, side, "write", "lib.execute")
        if record:
            record_use(ws, side)
        del ws
        findings = san.flush()
        return findings, san.report(findings)


def test_a_declared_use_makes_an_uncovered_free_visible():
    findings, report = _raw_write_then_free({}, record=False)
    assert [type(f).__name__ for f in findings] == ["UncoveredFree"], report
    assert "lib.execute[declared] (write)" in report and "`ws`" in report, report


def test_record_use_covers_the_declared_use():
    assert _raw_write_then_free({}, record=True)[0] == []


def test_a_declared_read_races_an_unordered_write():
    side = sd.Stream()
    with pytest.raises(DataRaceError, match="lib.read"):
        with LifetimeSanitizer("sim", on_race="raise"):
            x = torch.ones(64)  # written on the default stream
            with sd.stream(side):
                declare_access(x, access="read", what="lib.read")  # the side stream (current) reads it, unordered


def test_the_current_stream_is_the_default():
    side = sd.Stream()
    with LifetimeSanitizer("sim") as san:
        x = torch.ones(64)
        side.wait_stream(sd.current_stream())
        with sd.stream(side):
            declare_access(x, what="lib.read")
        del x
        findings = san.flush()
    assert [type(f).__name__ for f in findings] == ["UncoveredFree"]


def test_without_a_sanitizer_it_does_nothing():
    declare_access(torch.ones(4), what="lib.read")


@pytest.mark.parametrize("args, kwargs, error", [
    (("not a tensor",), {}, TypeError),
    ((torch.ones(2),), {"access": "rw"}, ValueError),
    ((torch.ones(2),), {"what": ""}, ValueError),
])
def test_bad_arguments_are_refused(args, kwargs, error):
    with pytest.raises(error):
        declare_access(*args, **kwargs)


def test_a_declaration_from_a_worker_thread_is_seen():
    """A library's calls often run on a worker thread (a prefetcher, a comm thread)."""
    import threading

    side = sd.Stream()
    with LifetimeSanitizer("sim") as san:
        ws = torch.empty(4096, dtype=torch.uint8)
        side.wait_stream(sd.current_stream())

        def library_call():
            with sd.stream(side):
                declare_access(ws, side, "write", "lib.execute")

        worker = threading.Thread(target=library_call)
        worker.start()
        worker.join()
        del ws
        findings = san.flush()
    assert [type(f).__name__ for f in findings] == ["UncoveredFree"], san.report(findings)
