"""The stand-in CANN runtime (tests/platforms/npu_standin) under the real torch_npu:
each case runs a program of tests/platforms/npu_programs in the torch_npu interpreter
(NPU_LIFETIME_NPU_PYTHON), at torch_npu's default task queue and, where
ordering matters, at TASK_QUEUE_ENABLE=0, 1 and 2. Nothing here runs on NPU
hardware."""
import math
import shutil
import subprocess

import pytest

from helpers.npu_helpers import (TASK_QUEUE_LEVELS, npu_environment, program_result, requires_standin, run_npu_program,
                         task_queue_env)

pytestmark = requires_standin

TEST_ALLOCATOR = r"""
#include <stddef.h>
#include <stdint.h>
int aclrtMalloc(void **devPtr, size_t size, int policy);
int aclrtFree(void *devPtr);
uint64_t test_allocs, test_frees, test_bytes;
void *test_alloc(size_t size, int device, void *stream)
{
    void *ptr = NULL;
    (void)device; (void)stream;
    test_allocs++; test_bytes += size;
    return aclrtMalloc(&ptr, size, 0) == 0 ? ptr : NULL;
}
void test_free(void *ptr, size_t size, int device, void *stream)
{
    (void)size; (void)device; (void)stream;
    test_frees++;
    aclrtFree(ptr);
}
"""


def levels(*chosen):
    return pytest.mark.parametrize("task_queue", chosen, ids=lambda level: f"task_queue={level or 'default'}")


def test_available_with_device_count_from_the_environment():
    result = program_result(run_npu_program("standin_basics.py", env={"NPU_STANDIN_DEVICES": "2"}))
    assert result["available"] is True
    assert result["device_count"] == 2


@levels(None, "0")
def test_common_ops_give_the_right_values(task_queue):
    env = dict(task_queue_env(task_queue), NPU_STANDIN_DELAY_US="200")
    result = program_result(run_npu_program("standin_basics.py", env=env))
    assert result["device_count"] == 1
    assert result["ones"] == [[1.0, 1.0], [1.0, 1.0]]
    assert result["zeros"] == [0.0, 0.0, 0.0]
    assert result["full"] == [[2.5] * 3] * 2
    assert result["to_npu_and_back"] == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    assert result["add"] == [[2.5, 3.5, 4.5], [5.5, 6.5, 7.5]]
    assert result["add_scalar"] == [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
    assert result["add_alpha"] == [[5.0, 6.0, 7.0], [8.0, 9.0, 10.0]]
    assert result["sub"] == [[-2.5, -1.5, -0.5], [0.5, 1.5, 2.5]]
    assert result["mul"] == [[0.0, 2.5, 5.0], [7.5, 10.0, 12.5]]
    assert result["mul_scalar"] == [[0.0, 3.0, 6.0], [9.0, 12.0, 15.0]]
    assert result["broadcast_add"] == [[10.0, 21.0, 32.0], [13.0, 24.0, 35.0]]
    assert result["transpose_contiguous"] == [[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]]
    assert result["int64"] == [0, 2, 4, 6, 8]
    assert result["to_int64"] == [[0, 1, 2], [3, 4, 5]]
    assert result["to_float16"] == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    assert result["bool"] == [True, True, True]
    assert result["sum"] == 15.0
    assert result["sum_dim"] == [3.0, 12.0]
    assert result["mean_dim0"] == [1.5, 2.5, 3.5]
    assert result["mm"] == [[5.0, 14.0], [14.0, 50.0]]
    assert sum(result["tanh_neg_abs"], []) == pytest.approx([math.tanh(v) for v in range(6)])
    assert result["equal"] == [True, False]
    assert result["eq"] == [[True, False, True], [False, True, False]]
    assert result["compare_scalar"] == [
        [[False, False, False], [True, True, True]], [[False, False, True], [True, True, True]],
        [[True, True, False], [False, False, False]], [[True, True, True], [False, False, False]],
        [[True, True, False], [True, True, True]]]
    assert result["gt_tensor_broadcast"] == [[False, False, True], [False, False, True]]
    assert result["gt_int_vs_real"] == [True, True, True]
    assert result["gt_in_place"] == [[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]]
    assert result["isfinite"] == [True, False, False, True]
    assert result["nonzero"] == [[0, 1], [1, 0], [1, 2]]
    assert result["nonzero_none"] == [0, 1]
    assert result["bool_of_a_comparison"] is True
    assert result["copy_chain"] == [3.0, 6.0, 9.0, 12.0]
    assert result["pinned_non_blocking"] == [0.0, 1.0, 2.0, 3.0]
    assert abs(result["randn"]["mean"]) < 0.15 and 0.85 < result["randn"]["std"] < 1.15
    assert result["randn"]["differ"] and result["randn_seeded_repeat"] and result["rand_in_range"]
    assert all(count > 0 for count in result["kernel_calls"].values()), result["kernel_calls"]


@levels(*TASK_QUEUE_LEVELS)
def test_consumer_stream_reads_stale_data_without_a_wait(task_queue):
    result = program_result(run_npu_program("standin_streams.py", env=task_queue_env(task_queue)))
    unordered = result["without_wait"]
    assert unordered["launched"]
    assert unordered["before_resume"]["producer_pending"] >= 1  # the write is held
    assert unordered["before_resume"]["consumer_pending"] == 0  # the read already ran...
    assert unordered["y"] == [0.0] * 4  # ...on the stale value
    assert unordered["x"] == [1.0] * 4  # the write landed after it
    ordered = result["with_wait_stream"]
    assert ordered["launched"]
    assert ordered["before_resume"]["consumer_pending"] >= 2  # the wait and the read are held
    assert ordered["y"] == [2.0] * 4
    assert result["same_stream"] == [15.0] * 4


@levels(*TASK_QUEUE_LEVELS)
def test_events_fire_when_their_stream_reaches_them(task_queue):
    result = program_result(run_npu_program("standin_events.py", env=task_queue_env(task_queue)))
    held = result["held_record"]
    assert held["record_reached_runtime"] and held["records"] == 1
    assert held["while_held"] == {"query": False, "side_pending": 2, "waiter_pending": 2}
    assert held["query_after"] is True
    assert held["waiter_result"] == [10.0, 10.0]
    elapsed = result["elapsed"]
    assert elapsed["query"] == [True, True]
    assert 2 * elapsed["delay_ms"] <= elapsed["elapsed_ms"] < 60 * elapsed["delay_ms"]
    assert result["sleep"]["slept_ms"] <= result["sleep"]["elapsed_ms"] < 60 * result["sleep"]["slept_ms"]
    assert result["never_recorded"] == {"query": True, "after_wait": [2.0, 2.0, 2.0, 2.0]}


@levels(None, "0")
def test_out_of_memory_against_the_cap_raises_and_the_program_goes_on(task_queue):
    cap = 256 << 20
    env = dict(task_queue_env(task_queue), NPU_STANDIN_MEMORY_BYTES=str(cap))
    result = program_result(run_npu_program("standin_oom.py", env=env))
    assert result["is_torch_oom"], result
    assert result["is_torch_npu_oom"] in (True, None)
    assert 1 <= result["chunks_held"] < cap // (32 << 20)
    assert result["in_use_at_error"] <= cap
    assert result["in_use_after_empty_cache"] < cap // 2
    assert result["after"] == [3.0, 3.0]


@pytest.fixture(scope="module")
def test_allocator(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    libdir = npu_environment()["NPU_STANDIN_LIBRARY"].rsplit("/", 1)[0]
    directory = tmp_path_factory.mktemp("test_allocator")
    source = directory / "test_allocator.c"
    source.write_text(TEST_ALLOCATOR)
    out = directory / "libtest_allocator.so"
    subprocess.run([cc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", str(source), "-o", str(out),
                    f"-L{libdir}", "-lascendcl", f"-Wl,-rpath,{libdir}"], check=True)
    return out


@levels(*TASK_QUEUE_LEVELS)
def test_pluggable_allocator_serves_the_allocations(test_allocator, task_queue):
    result = program_result(run_npu_program("standin_pluggable.py", str(test_allocator),
                                            env=task_queue_env(task_queue)))
    assert result["values"] == [6.0, 6.0, 6.0]
    assert result["allocs"] >= 3 and result["bytes_allocated"] >= 3 * 4000
    assert result["frees"] >= 2
