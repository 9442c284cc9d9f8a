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
from npu_lifetime.shim.install import cross_stream_mode
from npu_lifetime.shim.libnpl import library
from helpers.shim_testing import build_shim, check_invariants

MIB = 1 << 20


def _new_stream_per_step(steps, cross_stream, synchronize=False):
    """vllm-project/vllm#52950's pattern: each step a new stream allocates,
    fills and frees a large buffer (and, with ``synchronize``, the host
    waits for the stream, as vLLM's weight sync does).  Reserved bytes after
    each step."""
    shim.set_cross_stream_reuse(cross_stream)
    reserved = []
    for step in range(steps):
        stream = 0x10000 + step  # a new stream each step
        ptr = shim.alloc(8 * MIB, 0, stream)
        assert shim.sim.fill(stream, ptr, step % 256, 8 * MIB)
        shim.free(ptr, 8 * MIB, 0, stream)
        if synchronize:
            shim.sim.complete(stream)
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


def test_idle_mode_keeps_a_synchronised_new_stream_per_step_flat_without_waits(sim_shim):
    """vLLM's weight sync synchronises each step: the old stream is idle, so
    idle mode takes its segment with no GPU-side wait at all."""
    reserved = _new_stream_per_step(12, "idle", synchronize=True)
    assert reserved == [reserved[0]] * 12, reserved
    s = shim.stats()
    assert s["cross_stream_segments"] == 11 and s["stream_waits"] == 0


def test_idle_mode_leaves_a_busy_streams_segment_where_it_is(sim_shim):
    """A's write is still queued: taking A's segment would make B wait on A,
    a dependency torch's allocator (a new segment) never adds."""
    shim.set_cross_stream_reuse("idle")
    a, b = 0x1000, 0x2000
    p = shim.alloc(4 * MIB, 0, a)
    assert shim.sim.fill(a, p, 0xAA, 4 * MIB)  # queued on A, not run
    shim.free(p, 4 * MIB, 0, a)
    q = shim.alloc(4 * MIB, 0, b)
    assert q != p and shim.stats()["cross_stream_segments"] == 0 and shim.sim.stream_waits(b) == 0
    shim.free(q, 4 * MIB, 0, b)
    shim.sim.complete(a)  # A is done: now its segment may move, still without a wait
    r = shim.alloc(4 * MIB, 0, 0x3000)
    assert r in (p, q) and shim.stats()["cross_stream_segments"] == 1 and shim.sim.stream_waits(0x3000) == 0
    check_invariants()


def test_idle_mode_waits_for_a_third_streams_use_too(sim_shim):
    """A is idle but C's record_use'd use of the block is not done: not idle."""
    shim.set_policy("lazy_wait")
    shim.set_cross_stream_reuse("idle")
    a, b, c = 0x1000, 0x2000, 0x3000
    p = shim.alloc(4 * MIB, 0, a)
    assert shim.sim.fill(c, p, 0xCC, 4 * MIB)
    shim.record_use(p, c)
    shim.free(p, 4 * MIB, 0, a)
    assert shim.alloc(4 * MIB, 0, b) != p
    assert shim.stats()["cross_stream_segments"] == 0
    check_invariants()


@pytest.mark.parametrize("mode", ["idle", "always"])
def test_the_out_of_memory_path_takes_a_busy_segment_behind_a_wait_before_releasing(sim_shim, mode):
    """The device is full and A's segment is busy: instead of torch's path
    (synchronise, give the cached segment back, allocate anew), B waits on A
    GPU-side and takes the segment; B's write lands after A's."""
    shim.set_cross_stream_reuse(mode)
    shim.sim.set_memory_limit(20 * MIB)  # one large segment (a 4 MiB request takes a 20 MiB one)
    a, b = 0x1000, 0x2000
    p = shim.alloc(4 * MIB, 0, a)
    assert p != 0
    assert shim.sim.fill(a, p, 0xAA, 4 * MIB)
    shim.free(p, 4 * MIB, 0, a)
    q = shim.alloc(4 * MIB, 0, b)
    assert q == p
    s = shim.stats()
    assert s["cross_stream_segments"] == 1 and s["num_device_free"] == 0
    assert s["num_alloc_retries"] == (1 if mode == "idle" else 0)  # always: taken before the path
    assert shim.sim.fill(b, q, 0xBB, 4 * MIB)
    shim.sim.complete(b)  # held behind the wait on A
    shim.sim.complete(a)
    shim.sim.complete(b)
    assert ctypes.string_at(q, 16) == b"\xbb" * 16
    check_invariants()


def test_with_the_option_off_the_out_of_memory_path_releases_as_torchs_does(sim_shim):
    shim.set_cross_stream_reuse("off")
    shim.sim.set_memory_limit(20 * MIB)  # one large segment (a 4 MiB request takes a 20 MiB one)
    a, b = 0x1000, 0x2000
    p = shim.alloc(4 * MIB, 0, a)
    assert p != 0
    shim.free(p, 4 * MIB, 0, a)
    assert shim.alloc(4 * MIB, 0, b) != 0
    s = shim.stats()
    assert s["cross_stream_segments"] == 0 and s["num_device_free"] == 1


def test_modes_are_checked(sim_shim):
    for mode in ("off", "idle", "always"):
        shim.set_cross_stream_reuse(mode)
        assert shim.cross_stream_reuse() == mode
    shim.set_cross_stream_reuse(True)
    assert shim.cross_stream_reuse() == "always"
    with pytest.raises(ValueError, match="cross-stream reuse must be one of"):
        shim.set_cross_stream_reuse("sometimes")
    assert library().npl_set_cross_stream_reuse(7) == -1  # the C ABI refuses an unknown mode
    assert shim.cross_stream_reuse() == "always"


@pytest.mark.parametrize("value, mode", [(None, "idle"), ("0", "off"), ("off", "off"), ("idle", "idle"),
                                         ("1", "always"), ("Always", "always")])
def test_install_takes_the_mode_from_the_environment_idle_by_default(monkeypatch, value, mode):
    if value is None:
        monkeypatch.delenv("NPU_LIFETIME_CROSS_STREAM_REUSE", raising=False)
    else:
        monkeypatch.setenv("NPU_LIFETIME_CROSS_STREAM_REUSE", value)
    assert cross_stream_mode() == mode


def test_a_bad_mode_in_the_environment_is_refused(monkeypatch):
    monkeypatch.setenv("NPU_LIFETIME_CROSS_STREAM_REUSE", "sometimes")
    with pytest.raises(ValueError, match="must be one of off, always, idle"):
        cross_stream_mode()


def test_a_reuse_without_the_wait_is_caught(tmp_path):
    """A shim built to hand another stream's segment over without waiting
    on that stream: the ordering test above fails against it."""
    library = build_shim(tmp_path, "-DNPL_MUTANT_CROSS_STREAM")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", __file__,
                           "-k", "runs_after_the_old_owners_work and poll"], capture_output=True, text=True,
                          timeout=600, env=dict(os.environ, NPU_LIFETIME_SHIM=str(library)),
                          cwd=os.path.dirname(__file__))
    assert done.returncode == 1 and "1 failed" in done.stdout, done.stdout[-3000:]
