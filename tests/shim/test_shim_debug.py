"""Debug mode on the simulated runtime: freed blocks are poisoned once
really free and quarantined; a missing hand-off reads NaN at once instead of
another owner's data once in a while, and a write into freed memory is
reported with the last owner when the block leaves the quarantine."""
import ctypes
import struct

import pytest

from conftest import S1, S2

KB = 1024


def floats(ptr, n):
    return struct.unpack(f"{n}f", ctypes.string_at(ptr, 4 * n))


@pytest.fixture
def debug_shim(sim_shim):
    sim_shim.set_policy("lazy_wait")
    sim_shim.set_debug(True, 64 * KB)
    yield sim_shim
    sim_shim.set_debug(False)


def test_a_block_freed_without_hand_off_reads_nan_at_once(debug_shim):
    x = debug_shim.alloc(4 * KB, 0, S1)
    ctypes.memmove(x, struct.pack("4f", 1, 2, 3, 4), 16)
    debug_shim.free(x, 4 * KB, 0, S1)  # a reader on S2 still queued: the missing record_use
    assert floats(x, 1) == (1.0,)  # the fill is queued on S1 ...
    debug_shim.sim.complete(S1)  # ... and lands as soon as S1 runs on
    assert all(v != v for v in floats(x, 4))  # what the late reader sees: NaN, every run
    assert debug_shim.alloc(4 * KB, 0, S1) != x  # quarantined, not handed to a new owner


def test_a_block_with_pending_events_is_poisoned_only_once_they_fired(debug_shim):
    x = debug_shim.alloc(4 * KB, 0, S1)
    ctypes.memmove(x, struct.pack("f", 7.0), 4)
    debug_shim.record_use(x, S2)
    debug_shim.free(x, 4 * KB, 0, S1)
    debug_shim.sim.complete(S1)
    assert floats(x, 1) == (7.0,)  # S2 may still read it: not poisoned yet
    debug_shim.sim.complete(S2)
    debug_shim.process_events()
    debug_shim.sim.complete(S1)
    assert floats(x, 1)[0] != floats(x, 1)[0]


def test_a_write_after_the_free_is_reported_with_the_last_owner(debug_shim):
    x = debug_shim.alloc(4 * KB, 0, S1)
    debug_shim.record_stream(x, S2)
    debug_shim.free(x, 4 * KB, 0, S1)
    debug_shim.sim.complete(S2)
    debug_shim.process_events()  # really free: poisoned and quarantined
    debug_shim.sim.complete(S1)
    ctypes.memset(x + 100, 0, 8)  # a late kernel of the last owner writes into it
    debug_shim.empty_cache()  # leaves the quarantine: checked
    [f] = [f for f in debug_shim.findings() if f["kind"] == "write_after_free"]
    assert f["address"] == x and f["alloc_stream"] == S1 and f["streams"] == [S2]
    assert "8 byte(s) seen written after the free (whole block checked), the first at offset 100" in f["detail"]
    assert debug_shim.stats()["poison_violations"] == 1


def test_the_quarantine_is_fifo_and_bounded_by_bytes(debug_shim):
    blocks = [debug_shim.alloc(16 * KB, 0, S1) for _ in range(6)]
    for b in blocks:
        debug_shim.free(b, 16 * KB, 0, S1)
    s = debug_shim.stats()
    assert s["quarantined_bytes.all.current"] <= 64 * KB
    assert s["poison_checks"] == 2  # the two oldest left, after a check
    assert debug_shim.findings() == []


def test_turning_debug_off_releases_the_quarantine(debug_shim):
    x = debug_shim.alloc(4 * KB, 0, S1)
    debug_shim.free(x, 4 * KB, 0, S1)
    debug_shim.set_debug(False)
    assert debug_shim.stats()["quarantined.all.current"] == 0
    assert debug_shim.alloc(4 * KB, 0, S1) == x


def test_a_large_block_is_checked_at_samples_that_catch_a_kernel_sized_write(debug_shim):
    debug_shim.set_debug(True, 4 << 20)
    x = debug_shim.alloc(1 << 20, 0, S1)
    debug_shim.free(x, 1 << 20, 0, S1)
    debug_shim.sim.complete(S1)
    ctypes.memset(x + 300_000, 0, 64 << 10)  # a late kernel writes 64 KiB of it
    debug_shim.empty_cache()
    [f] = [f for f in debug_shim.findings() if f["kind"] == "write_after_free"]
    assert "(sampled)" in f["detail"]
