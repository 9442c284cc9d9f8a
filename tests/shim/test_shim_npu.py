"""The NPU side, without an NPU: torch_npu's task queue (played by the
stand-in ACL library) and the NPUStream-taking hooks of NPUPluggableAllocator."""
import ctypes
import struct

import pytest

from npu_lifetime import shim
from npu_lifetime.shim import npu_queue
from npu_lifetime.shim.libnpl import library

A, U = 0x5000, 0x6000


def test_with_the_task_queue_on_an_event_can_complete_before_queued_kernels(acl_shim):
    # Why install('npu') refuses the queue: aclrtRecordEvent goes straight to
    # the device while the user's kernel still waits on the host.
    acl_shim.fake_acl_set_task_queue(1)
    x = shim.alloc(4096, 0, A)
    acl_shim.fake_acl_launch(U)  # a kernel reading x, queued on U (held on the host)
    shim.record_use(x, U)  # the event lands on U's device queue before the kernel
    shim.free(x, 4096, 0, A)
    acl_shim.fake_acl_complete(U)
    assert shim.alloc(4096, 0, A) == x  # reusable ...
    assert acl_shim.fake_acl_kernels_pending(U) == 1  # ... while the reader has not run


def test_with_the_task_queue_off_the_event_follows_the_kernel(acl_shim):
    x = shim.alloc(4096, 0, A)
    acl_shim.fake_acl_launch(U)
    shim.record_use(x, U)
    shim.free(x, 4096, 0, A)
    assert shim.alloc(4096, 0, A) != x
    acl_shim.fake_acl_complete(U)
    assert acl_shim.fake_acl_kernels_pending(U) == 0


@pytest.mark.parametrize("env, mode", [({}, 1), ({"TASK_QUEUE_ENABLE": "2"}, 2), ({"TASK_QUEUE_ENABLE": "0"}, 0),
                                       ({"TASK_QUEUE_ENABLE": "1", "ASCEND_LAUNCH_BLOCKING": "1"}, 0)])
def test_the_queue_mode_is_read_as_torch_npu_reads_it(monkeypatch, env, mode):
    monkeypatch.delenv("TASK_QUEUE_ENABLE", raising=False)
    monkeypatch.delenv("ASCEND_LAUNCH_BLOCKING", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert npu_queue.queue_mode() == mode


@pytest.fixture
def queued_acl_shim(fake_acl_library):
    """The ACL runtime behind the stand-in's task-queue operations (what the
    NPU bridge gives the shim under torch_npu)."""
    path, lib = fake_acl_library
    lib.fake_npu_queue_ops.restype = ctypes.c_void_p
    shim.reset()
    shim.select_runtime("sim")
    assert library().npl_set_acl_queue_ops(lib.fake_npu_queue_ops()) == 0
    shim.select_runtime("acl", str(path))
    lib.fake_acl_set_task_queue(1)
    lib.fake_acl_reset_counters()
    yield lib
    lib.fake_acl_set_task_queue(0)
    shim.reset()
    shim.select_runtime("sim")
    assert library().npl_set_acl_queue_ops(None) == 0


@pytest.mark.parametrize("policy", ["poll", "lazy_wait", "stream_wait"])
def test_with_the_task_queue_on_the_queued_event_follows_the_kernel(queued_acl_shim, policy):
    # The case the first test shows failing with plain ACL calls.
    shim.set_policy(policy)
    x = shim.alloc(4096, 0, A)
    queued_acl_shim.fake_acl_launch(U)  # held on the host
    shim.record_use(x, U)
    shim.free(x, 4096, 0, A)
    y = shim.alloc(4096, 0, A)
    if y == x:  # handed out at once: only behind a wait on U's event, which follows the kernel
        assert policy != "poll"
        assert queued_acl_shim.fake_acl_calls(b"aclrtStreamWaitEvent") == 1
    assert queued_acl_shim.fake_acl_kernels_pending(U) == 1
    queued_acl_shim.fake_acl_complete(U)
    shim.process_events()
    assert shim.stats()["pending.all.current"] == 0


def test_the_queue_operations_are_refused_while_the_acl_runtime_is_in_use(acl_shim):
    acl_shim.fake_npu_queue_ops.restype = ctypes.c_void_p
    assert library().npl_set_acl_queue_ops(acl_shim.fake_npu_queue_ops()) == -1
    assert "before the ACL runtime is selected" in library().npl_last_error().decode()


def test_npu_record_stream_hook_takes_an_npustream(acl_shim):
    lib = library()
    resolver = ctypes.cast(acl_shim.fake_npu_stream_handle, ctypes.c_void_p).value
    lib.npl_set_npu_stream_resolver(resolver)
    record = ctypes.cast(lib.npl_torch_npu_record_stream, ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p))
    erase = ctypes.cast(lib.npl_torch_npu_erase_stream, ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p))
    x = shim.alloc(4096, 0, A)
    npu_stream = ctypes.create_string_buffer(struct.pack("<bbxxxxxxq", 20, 3, U), 16)  # PrivateUse1, npu:3
    record(x, ctypes.addressof(npu_stream))
    [block] = [b for s in shim.snapshot()["segments"] for b in s["blocks"] if b["address"] == x]
    assert block["recorded_streams"] == [U]
    shim.free(x, 4096, 0, A)
    assert acl_shim.fake_acl_current_device() == 0  # the event was created on npu:3, then back
    assert shim.stats()["pending.all.current"] == 1
    y = shim.alloc(4096, 0, A)
    record(y, ctypes.addressof(npu_stream))
    erase(y, ctypes.addressof(npu_stream))
    [block] = [b for s in shim.snapshot()["segments"] for b in s["blocks"] if b["address"] == y]
    assert block["recorded_streams"] == []
    assert shim.findings() == []
