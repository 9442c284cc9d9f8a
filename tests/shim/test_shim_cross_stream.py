"""Cross-stream reuse on the simulated runtime (off by default): an
allocation its own stream's pool can't serve takes a whole free segment of
another stream's pool, once the allocating stream waits GPU-side on that
stream's work and on the block's events.  The simulated streams run queued
fills in stream order, so an early reuse would show as the old owner's
write landing over the new owner's data."""
import ctypes
import os
import subprocess
import sys

import pytest

from npu_lifetime import shim
from helpers.shim_testing import build_shim, check_invariants

MIB = 1 << 20


def _new_stream_per_step(steps, cross_stream):
    """vllm-project/vllm#52950's pattern: each step a new stream allocates,
    fills and frees a large buffer.  Reserved bytes after each step."""
    shim.set_cross_stream_reuse(cross_stream)
    reserved = []
    for step in range(steps):
        stream = 0x10000 + step  # a new stream each step
        ptr = shim.alloc(8 * MIB, 0, stream)
        assert shim.sim.fill(stream, ptr, step % 256, 8 * MIB)
        shim.free(ptr, 8 * MIB, 0, stream)
        reserved.append(shim.stats()["reserved_bytes.all.current"])
    shim.sim.complete_all()
    check_invariants()
    return reserved


def test_a_new_stream_per_step_strands_memory_by_default(sim_shim):
    reserved = _new_stream_per_step(12, cross_stream=False)
    assert reserved[-1] == 12 * reserved[0], reserved  # torch's behaviour: one segment per stream


def test_cross_stream_reuse_keeps_memory_flat(sim_shim):
    reserved = _new_stream_per_step(12, cross_stream=True)
    assert reserved == [reserved[0]] * 12, reserved
    assert shim.stats()["stream_waits"] >= 11  # each step waited on the previous stream GPU-side


@pytest.mark.parametrize("policy", ["poll", "lazy_wait", "stream_wait"])
def test_the_new_owner_runs_after_the_old_owners_work(sim_shim, policy):
    """A's write is still queued when A frees the block; B takes the segment
    and writes: B's write must land after A's (B waits on A's event)."""
    shim.set_policy(policy)
    shim.set_cross_stream_reuse(True)
    a, b = 0x1000, 0x2000
    p = shim.alloc(4 * MIB, 0, a)
    assert shim.sim.fill(a, p, 0xAA, 4 * MIB)  # queued on A, not run
    shim.free(p, 4 * MIB, 0, a)
    q = shim.alloc(4 * MIB, 0, b)
    assert q == p, "B did not take A's free segment"
    assert shim.sim.fill(b, q, 0xBB, 4 * MIB)
    shim.sim.complete(b)  # B runs up to its wait on A's event (without the wait: B's write lands now...)
    shim.sim.complete(a)  # ...and A's after it
    shim.sim.complete(b)
    assert ctypes.string_at(q, 16) == b"\xbb" * 16
    check_invariants()


def test_a_record_use_on_a_third_stream_is_waited_for(sim_shim):
    shim.set_policy("lazy_wait")
    shim.set_cross_stream_reuse(True)
    a, b, c = 0x1000, 0x2000, 0x3000
    p = shim.alloc(4 * MIB, 0, a)
    assert shim.sim.fill(c, p, 0xCC, 4 * MIB)  # C uses it (queued)
    shim.record_use(p, c)
    shim.free(p, 4 * MIB, 0, a)
    q = shim.alloc(4 * MIB, 0, b)
    assert q == p
    assert shim.sim.fill(b, q, 0xBB, 4 * MIB)
    shim.sim.complete(b)  # held back (without the waits: B's write lands now...)
    shim.sim.complete(c)  # ...and C's after it
    shim.sim.complete(a)
    shim.sim.complete(b)
    assert ctypes.string_at(q, 16) == b"\xbb" * 16  # C's write came first
    check_invariants()


def test_a_pending_record_stream_block_is_not_taken(sim_shim):
    """Under poll a record_stream'ed block stays out of the pools until its
    event fired: another stream gets fresh memory."""
    shim.set_policy("poll")
    shim.set_cross_stream_reuse(True)
    a, b, c = 0x1000, 0x2000, 0x3000
    p = shim.alloc(4 * MIB, 0, a)
    shim.sim.launch(c)
    shim.record_stream(p, c)
    shim.free(p, 4 * MIB, 0, a)
    assert shim.alloc(4 * MIB, 0, b) != p
    check_invariants()


def test_split_segments_and_the_default_stay_put(sim_shim):
    """Only whole free segments move; with the option off nothing does."""
    shim.set_cross_stream_reuse(True)
    a, b = 0x1000, 0x2000
    keep = shim.alloc(1 * MIB, 0, a)  # 1 MiB of a 2 MiB segment stays live: the segment is not whole
    p = shim.alloc(512 * 1024, 0, a)
    shim.free(p, 512 * 1024, 0, a)
    q = shim.alloc(512 * 1024, 0, b)
    assert not (keep <= q < keep + 2 * MIB)
    shim.free(keep, 1 * MIB, 0, a)
    check_invariants()


def test_a_reuse_without_the_wait_is_caught(tmp_path):
    """A shim built to hand another stream's segment over without waiting
    on that stream: the ordering test above fails against it."""
    library = build_shim(tmp_path, "-DNPL_MUTANT_CROSS_STREAM")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", __file__,
                           "-k", "runs_after_the_old_owners_work and poll"], capture_output=True, text=True,
                          timeout=600, env=dict(os.environ, NPU_LIFETIME_SHIM=str(library)),
                          cwd=os.path.dirname(__file__))
    assert done.returncode == 1 and "1 failed" in done.stdout, done.stdout[-3000:]
