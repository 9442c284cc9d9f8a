"""The out-of-memory path (simulated runtime with a memory limit): before
failing, the shim processes events, waits for pending blocks' events,
drops fired events, releases free segments and retries; it honours the
memory fraction; a failure is an out_of_memory finding with the figures
(and, under torch, torch.OutOfMemoryError: see test_gpu_oom / the bridge tests)."""
import re

import pytest

from conftest import S1, S2

MB = 1 << 20


@pytest.mark.parametrize("policy", ["poll", "lazy_wait"])
def test_record_stream_blocks_on_a_busy_stream_are_waited_for_not_failed(sim_shim, policy):
    # torch's record_stream OOM test: big blocks recorded on a busy side
    # stream, freed, allocated again until memory would run out
    sim_shim.set_policy(policy)
    sim_shim.sim.set_memory_limit(200 * MB)
    for i in range(30):
        p = sim_shim.alloc(40 * MB, 0, S1)
        assert p != 0, f"allocation {i}: {sim_shim.last_oom_message()}"
        sim_shim.record_stream(p, S2)  # S2 never finishes by itself
        sim_shim.free(p, 40 * MB, 0, S1)
    s = sim_shim.stats()
    assert s["num_alloc_retries"] > 0 and s["num_sync_all_streams"] > 0 and s["num_ooms"] == 0
    assert sim_shim.sim.event_syncs() > 0  # the host waited for S2's events
    assert sim_shim.findings() == []


def test_stream_wait_blocks_whose_events_fired_are_released_without_empty_cache(sim_shim):
    sim_shim.set_policy("stream_wait")
    sim_shim.sim.set_memory_limit(100 * MB)
    p = sim_shim.alloc(60 * MB, 0, S1)
    sim_shim.record_use(p, S2)
    sim_shim.free(p, 60 * MB, 0, S1)  # cached, carrying S2's event
    sim_shim.sim.complete(S2)
    q = sim_shim.alloc(60 * MB, 0, S2)  # another stream's pool: needs p's segment back
    assert q != 0, sim_shim.last_oom_message()


def test_a_cached_block_that_fits_after_the_wait_is_used_not_a_new_segment(sim_shim):
    sim_shim.set_policy("poll")
    sim_shim.sim.set_memory_limit(64 * MB)
    p = sim_shim.alloc(40 * MB, 0, S1)
    sim_shim.record_use(p, S2)
    sim_shim.free(p, 40 * MB, 0, S1)
    assert sim_shim.alloc(40 * MB, 0, S1) == p  # found again after the wait
    assert sim_shim.stats()["num_device_alloc"] == 1


def test_failure_is_a_finding_with_the_figures_and_the_program_goes_on(sim_shim):
    sim_shim.sim.set_memory_limit(64 * MB)
    keep = sim_shim.alloc(40 * MB, 0, S1)
    assert sim_shim.alloc(100 * MB, 0, S1) == 0
    message = sim_shim.last_oom_message()
    assert "out of memory on device 0" in message and "Tried to allocate 100.00 MiB" in message
    assert "Of the allocated memory 40.00 MiB is allocated to live tensors" in message
    [f] = sim_shim.findings()
    assert f["kind"] == "out_of_memory" and f["size"] == 100 * MB and f["detail"] == message
    assert sim_shim.stats()["num_ooms"] == 1
    assert sim_shim.alloc(10 * MB, 0, S1) != 0  # the program continues
    sim_shim.free(keep, 40 * MB, 0, S1)


def test_the_message_has_torchs_sentences_that_its_tests_match(sim_shim):
    """torch's test_out_of_memory / test_out_of_memory_retry match its
    allocator's words; before, the shim's message had its own."""
    sim_shim.sim.set_memory_limit(64 * MB)
    assert sim_shim.alloc(800_000_000 << 30, 0, S1) == 0
    message = sim_shim.last_oom_message()
    assert re.search(r"Tried to allocate 800000000\.00 GiB\. device 0 has a total capacity of 64\.00 MiB", message)
    assert sim_shim.alloc(8_000_000_000 << 30, 0, S1) == 0
    assert "Tried to allocate more than 1EB memory" in sim_shim.last_oom_message()
    assert sim_shim.alloc(10 * MB, 0, S1) != 0  # the program continues


def test_the_memory_fraction_limits_reserved_bytes(sim_shim):
    sim_shim.sim.set_memory_limit(1000 * MB)
    assert sim_shim.memory_fraction(0) == 1.0  # torch's default: the whole device
    sim_shim.set_memory_fraction(0.1, 0)
    assert sim_shim.memory_fraction(0) == pytest.approx(0.1)
    assert sim_shim.alloc(60 * MB, 0, S1) != 0
    assert sim_shim.alloc(60 * MB, 0, S1) == 0  # 120 MB > 100 MB
    assert "memory fraction 0.1" in sim_shim.last_oom_message()
    sim_shim.set_memory_fraction(0.0, 0)  # as torch's: nothing may be reserved (test_get_per_process_memory_fraction)
    assert sim_shim.memory_fraction(0) == 0.0
    assert sim_shim.alloc(60 * MB, 0, S1) == 0
    sim_shim.set_memory_fraction(1.0, 0)
    assert sim_shim.alloc(60 * MB, 0, S1) != 0


def test_a_bad_fraction_is_refused(sim_shim):
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        sim_shim.set_memory_fraction(1.5, 0)


def test_during_a_capture_only_free_segments_are_released(sim_shim):
    sim_shim.set_policy("poll")
    sim_shim.sim.set_memory_limit(64 * MB)
    p = sim_shim.alloc(40 * MB, 0, S1)
    sim_shim.record_use(p, S2)
    sim_shim.free(p, 40 * MB, 0, S1)  # pending on S2
    sim_shim.begin_allocate_to_pool(0, (3, 0), S1)
    sim_shim.sim.set_capturing(S1, True)  # a real capture (an open pool alone freezes nothing: D5)
    assert sim_shim.alloc(40 * MB, 0, S1) == 0
    assert sim_shim.sim.event_syncs() == 0  # no wait on an event during a capture
    assert "during a graph capture" in sim_shim.last_oom_message()
    sim_shim.sim.set_capturing(S1, False)
    sim_shim.end_allocate_to_pool(0, (3, 0))
