"""Bad inputs that need a CUDA device (the CPU rows are in test_bad_inputs.py):
each a clear error, the good call beside it works, and a failed call changes
nothing.  Skipped without a GPU."""
import re

import pytest
from helpers.gpu_helpers import requires_cuda, run_program

pytestmark = requires_cuda


@pytest.fixture(scope="module")
def native():
    return run_program("bad_input_programs.py", "native")


@pytest.fixture(scope="module")
def installed():
    return run_program("bad_input_programs.py", "installed")


@pytest.mark.parametrize("case, error, message", [
    ("record_stream int stream", "RecordUseError",
     r"record_stream needs a stream \(e\.g\. torch\.cuda\.Stream\(\)\), not 7"),
    ("record_stream None", "RecordUseError", r"record_stream needs a stream .* not None"),
    ("record_stream simdevice stream", "RecordUseError", r"a simdevice stream goes with CPU tensors, not cuda"),
    ("record_stream freed storage", "RecordUseError", r"record_stream on a freed storage"),
    ("record_use int stream", "RecordUseError", r"record_use needs a stream \(e\.g\. torch\.cuda\.Stream\(\)\), not 7"),
    ("record_use simdevice stream", "RecordUseError", r"a simdevice stream goes with CPU tensors"),
    ("erase_stream without the shim", "RecordUseError",
     r"erase_stream needs the shim installed for cuda .* cannot withdraw a recorded stream"),
    ("install after cuda was used", "InstallError", r"already used in this process .*before any cuda tensor"),
])
def test_under_the_native_allocator(native, case, error, message):
    got = native[case]
    assert got != "ok" and got[0] == error and re.search(message, got[1], re.S), got


def test_under_the_native_allocator_good_calls_work_and_a_failed_install_changes_nothing(native):
    assert native["record_stream control"] == "ok" and native["record_use control"] == "ok"
    assert native["record_use empty tensor"] == "ok"
    assert native["shim runtime after the failed install"] == native["shim runtime before"]


@pytest.mark.parametrize("case, error, message", [
    ("install npu too", "InstallError", r"already installed for cuda; one device type per process"),
    ("install bad policy", "ValueError", r"policy must be one of .* not 'eventually'"),
    ("install debug int", "TypeError", r"debug must be True or False, not int 1"),
    ("memory_allocated beyond the devices", "ValueError", r"device \d+ does not exist: this machine has \d+ cuda"),
    ("memory_allocated index beyond the devices", "ValueError", r"does not exist"),
    ("memory_allocated cpu", "ValueError", r"'cpu' is a cpu device; the shim is installed for cuda"),
    ("erase_stream None", "RecordUseError", r"erase_stream needs a stream .* not None"),
    ("erase_stream int stream", "RecordUseError", r"erase_stream needs a stream \(e\.g\. torch\.cuda\.Stream\(\)\)"),
    ("erase_stream freed storage", "RecordUseError", r"erase_stream on a freed storage"),
    ("shim alloc with a stream object", "TypeError", r"pass its \.cuda_stream"),
])
def test_under_the_shim(installed, case, error, message):
    got = installed[case]
    assert got != "ok" and got[0] == error and re.search(message, got[1], re.S), got


def test_under_the_shim_good_calls_work_and_failed_calls_change_nothing(installed):
    for case in ("memory_allocated control", "memory_allocated str control", "record_stream then erase_stream control",
                 "shim alloc control"):
        assert installed[case] == "ok", (case, installed[case])
    assert installed["policy after the failed calls"] == "poll" and installed["debug after the failed calls"] is False
    assert installed["torch max_memory_allocated beyond the devices"] != "ok"  # torch's own call, routed to the shim
    assert installed["findings"] == []
