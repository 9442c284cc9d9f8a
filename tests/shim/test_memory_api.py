"""npu_lifetime.memory: torch's memory functions with torch's names and
meanings, over the shim (here on the simulated runtime)."""
import pytest

from conftest import S1, S2
from npu_lifetime import memory

MB = 1 << 20


def test_stats_use_torchs_keys_and_meanings(sim_shim):
    a = sim_shim.alloc(3 * MB, 0, S1)
    stats = memory.memory_stats(0)
    assert list(stats) == sorted(stats)
    assert stats["allocated_bytes.all.current"] == 3 * MB == memory.memory_allocated(0)
    assert stats["allocated_bytes.large_pool.current"] == 3 * MB and stats["allocated_bytes.small_pool.current"] == 0
    assert stats["reserved_bytes.all.current"] == 20 * MB == memory.memory_reserved(0)
    assert stats["requested_bytes.all.current"] == 3 * MB
    assert stats["segment.all.current"] == 1 and stats["num_device_alloc"] == 1
    for key in ("num_alloc_retries", "num_ooms", "active_bytes.all.peak", "inactive_split_bytes.all.current"):
        assert key in stats
    sim_shim.free(a, 3 * MB, 0, S1)
    assert memory.memory_allocated(0) == 0 and memory.max_memory_allocated(0) == 3 * MB


def test_pending_bytes_are_active_but_not_allocated(sim_shim):
    a = sim_shim.alloc(MB, 0, S1)
    sim_shim.record_stream(a, S2)
    sim_shim.free(a, MB, 0, S1)
    s = memory.memory_stats(0)
    assert s["allocated_bytes.all.current"] == 0
    assert s["active_bytes.all.current"] == s["pending_bytes.all.current"] == memory.memory_pending(0) == MB


def test_nested_dict_is_what_torch_flattens(sim_shim):
    sim_shim.alloc(100, 0, S1)
    nested = memory.memory_stats_as_nested_dict(0)
    assert nested["allocated_bytes"]["all"]["current"] == 512
    assert nested["num_ooms"] == 0


def test_reset_peak_and_accumulated(sim_shim):
    a = sim_shim.alloc(MB, 0, S1)
    sim_shim.free(a, MB, 0, S1)
    memory.reset_peak_memory_stats(0)
    assert memory.max_memory_allocated(0) == 0
    memory.reset_accumulated_memory_stats(0)
    assert memory.memory_stats(0)["allocated_bytes.all.allocated"] == 0


def test_empty_cache_and_fraction(sim_shim):
    a = sim_shim.alloc(MB, 0, S1)
    sim_shim.free(a, MB, 0, S1)
    memory.empty_cache()
    assert memory.memory_reserved(0) == 0
    memory.set_per_process_memory_fraction(0.5, 0)
    assert memory.get_per_process_memory_fraction(0) == pytest.approx(0.5)
    memory.set_per_process_memory_fraction(0.0, 0)


def test_every_statistic_is_explained(sim_shim):
    from npu_lifetime import shim

    meanings = shim.stat_meanings()
    roots = {name.split(".")[0] for name in shim.stat_names()}
    assert roots == set(meanings) and all(meanings.values())


def test_memory_snapshot_is_torchs_format(sim_shim):
    a = sim_shim.alloc(4096, 0, S1)
    sim_shim.record_use(a, S2)
    [seg] = memory.memory_snapshot()
    assert {"address", "total_size", "stream", "segment_type", "blocks"} <= set(seg)
    [block] = [b for b in seg["blocks"] if b["address"] == a]
    assert block["state"] == "active_allocated"
    assert any("record_use" in f["name"] or str(S2) in f["name"] or hex(S2) in f["name"] for f in block["frames"])
