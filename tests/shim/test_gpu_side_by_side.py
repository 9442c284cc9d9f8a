"""The shim against torch's own allocator, row by row of design/allocator-shim.md's
entry-point table (issue 37): tests/platforms/gpu_programs/side_by_side_programs.py runs
every row's program once under each allocator, each in a fresh process, and
each row's test compares the two answers.  Where the shim differs on
purpose, the test asserts the documented difference.  The table's rows are
read from the design note: a row without a comparison fails
test_every_entry_point_row_has_a_comparison (which runs without a GPU)."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.gpu_helpers import PROGRAMS, requires_cuda

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "design" / "allocator-shim.md"
TABLE_HEADER = "| entry point (`CUDAAllocator`) |"


def table_rows() -> list:
    """The first cell of each row of the entry-point table."""
    lines = DESIGN.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(TABLE_HEADER))
    rows = []
    for line in lines[start + 2:]:  # past the header and its |---| line
        if not line.startswith("|"):
            break
        rows.append(line.split("|")[1].strip())
    return rows


def program_rows() -> dict:
    """The program's row keys (its ROWS), read without importing torch's CUDA side."""
    source = (PROGRAMS / "side_by_side_programs.py").read_text()
    block = source[source.index("ROWS = {"):]
    block = block[:block.index("\n}\n")]
    return dict(re.findall(r'^    "(.+?)": (row_\w+),$', block, flags=re.M))


def key_of(row: str) -> str:
    """The program's key that covers a table row: the one its first cell starts with."""
    keys = [k for k in program_rows() if row.startswith(k)]
    assert len(keys) == 1, (row, keys)
    return keys[0]


ROWS = table_rows()


def test_every_entry_point_row_has_a_comparison():
    """Runs without a GPU: each table row is covered by exactly one program
    row and one comparison below, and nothing is compared that the table
    does not name (a new row, or a renamed one, fails here)."""
    assert len(ROWS) >= 19, ROWS
    keys = {key_of(row) for row in ROWS}
    assert keys == set(program_rows()), set(program_rows()) - keys
    assert keys == set(COMPARE), (keys ^ set(COMPARE))


def run_side(allocator: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, str(PROGRAMS / "side_by_side_programs.py"), allocator],
                          capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, (f"{allocator}: exit status {done.returncode}\nstdout: {done.stdout[-3000:]}\n"
                                  f"stderr: {done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def saved_or_run(allocator: str) -> dict:
    """tools/gpu_issue37_sidebyside.sh has each allocator's answers saved
    just before (NPL_SIDE_BY_SIDE_ANSWERS names the folder): read, not rerun."""
    folder = os.environ.get("NPL_SIDE_BY_SIDE_ANSWERS")
    saved = Path(folder) / f"side_by_side_{allocator}.json" if folder else None
    if saved is not None and saved.is_file() and saved.stat().st_size > 0:
        return json.loads(saved.read_text().strip().splitlines()[-1])
    return run_side(allocator)


@pytest.fixture(scope="module")
def answers():
    return {allocator: saved_or_run(allocator) for allocator in ("native", "shim")}


def same(native, shim, *fields):
    for field in fields:
        assert shim[field] == native[field], (field, native[field], shim[field])


def compare_allocate(native, shim):
    same(native, shim, "tensor_grew", "raw_grew", "after_deletes", "oom_type", "num_ooms")
    assert native["oom_type"] == "OutOfMemoryError" and native["tensor_grew"] == 1024
    # the message is the shim's own (the table: "with the shim's message"), but says the same
    assert shim["oom_says_out_of_memory"] and native["oom_says_out_of_memory"]


def compare_fraction(native, shim):
    same(native, shim, "initial", "fractions", "zero_refuses", "side_busy", "reused_while_busy")
    assert native["fractions"] == [1.0, 0.0, 0.25] and native["zero_refuses"]
    # the side stream must still be busy at the reuse, or the row tests nothing (it was not, while the
    # first launch of add_ waited for the sleep: CUDA's lazy kernel loading; the program loads both first)
    assert native["side_busy"] and not native["reused_while_busy"]


def compare_empty_cache(native, shim):
    same(native, shim, "cached", "after_empty_cache", "eager_kept_at_pool_release", "segment_releases")
    assert native["cached"] == 64 << 20 and native["after_empty_cache"] == 0


def compare_pools(native, shim):
    same(native, shim, "pool_segments", "out_in_pool", "released")
    assert native["out_in_pool"] and native["released"]


def compare_cache_info(native, shim):
    same(native, shim, "from_zero_is_free_memory", "from_one", "from_huge")
    assert native["from_zero_is_free_memory"] and native["from_one"] == 12 << 20 and native["from_huge"] == 1 << 50


def compare_history(native, shim):
    same(native, shim, "enabled", "entries", "snapshots")
    # one randn(1 << 20) (4 MiB) in a fresh 20 MiB segment, then its del
    assert native["entries"][:4] == [["segment_alloc", 20 << 20], ["alloc", 4 << 20], ["free_requested", 4 << 20],
                                     ["free_completed", 4 << 20]], native["entries"]
    assert native["enabled"] in ([True, False], [None, None])


def compare_snapshot(native, shim):
    """Pending blocks read active_pending_free under the shim (the table); the
    program synchronises first, so there are none."""
    same(native, shim, "segments", "snapshot_keys", "segment_keys_present")
    assert all(seg["address_present"] for seg in shim["segments"])


def compare_pool_references(native, shim):
    same(native, shim, "counts", "pool_segments")
    assert native["counts"] == [1, 2, 1]


def compare_use_on_oom(native, shim):
    same(native, shim, "pool_segments")


def compare_no_split(native, shim):
    same(native, shim, "layout")
    assert len(native["layout"]) == 2


def compare_check_pool_live(native, shim):
    same(native, shim, "answers")
    assert native["answers"] == [True, False]


def compare_checkpoint(native, shim):
    same(native, shim, "before", "freed", "after", "error", "unknown_pool_refused")
    assert native["after"] == native["before"] and native["error"] is None


def compare_device_stats(native, shim):
    same(native, shim, "held", "after_peak_reset", "after_accumulated_reset", "accelerator_allocated", "fraction")


def compare_ipc(native, shim):
    """Not supported under the shim (the table): the pluggable allocator's error."""
    assert native["shared"] is True
    assert shim["shared"] is False and "support" in shim["message"].lower(), shim


def compare_observers(native, shim):
    """The pluggable allocator's (the table): attaching is refused or the
    observer is never called under the shim; torch's calls it."""
    assert native["attached"] is True and native["called"]
    assert shim["attached"] is not True or not shim["called"], shim


def compare_expandable(native, shim):
    same(native, shim, "on", "off")
    assert native["on"] == [True] and native["off"] == [False]


def compare_expandable_sizes(native, shim):
    """The pluggable allocator's (the table: not answered)."""
    if native["route"] is None:
        pytest.skip("this torch has no Python route to getExpandableSegmentSizes")
    assert "sizes" in native and "error_message" in shim, (native, shim)


def compare_nested_pools(native, shim):
    """The table says the shim takes the innermost pool (the latest begin);
    whichever torch takes, the shim must take the same."""
    same(native, shim, "x", "y")
    assert len(native["x"]) == 1 and native["y"] == ["outer"]


def compare_capture_reuse(native, shim):
    same(native, shim, "accepted")
    if native["accepted"] is not True:
        pytest.skip(f"this torch has no graph_capture_record_stream_reuse: {native['accepted']}")
    same(native, shim, "reused", "result")
    assert native["result"] == 3.0


COMPARE = {
    "`allocate`, `raw_alloc`, `raw_delete`, `malloc`": compare_allocate,
    "`init`, `setMemoryFraction`, `getBaseAllocation`, `recordStream`": compare_fraction,
    "`emptyCache(mempool_id)`": compare_empty_cache,
    "`beginAllocateToPool`, `endAllocateToPool`, `releasePool`": compare_pools,
    "`cacheInfo`": compare_cache_info,
    "`recordHistory`, `isHistoryEnabled`": compare_history,
    "`snapshot`": compare_snapshot,
    "`createOrIncrefPool`, `getPoolUseCount`": compare_pool_references,
    "`setUseOnOOM`": compare_use_on_oom,
    "`setNoSplit`": compare_no_split,
    "`checkPoolLiveAllocations`": compare_check_pool_live,
    "`getCheckpointState`, `setCheckpointPoolState`": compare_checkpoint,
    "`getDeviceStats`, `resetPeakStats`, `resetAccumulatedStats`, `getMemoryFraction`": compare_device_stats,
    "`shareIpcHandle`, `getIpcDevPtr`": compare_ipc,
    "`attachOutOfMemoryObserver`, `attachAllocatorTraceTracker`": compare_observers,
    "expandable segments": compare_expandable,
    "`getExpandableSegmentSizes`": compare_expandable_sizes,
    "`beginAllocateToPool` nesting": compare_nested_pools,
    "`graph_capture_record_stream_reuse` (allocator setting)": compare_capture_reuse,
}


@requires_cuda
def test_both_allocators_ran_as_installed(answers):
    for allocator in ("native", "shim"):
        assert "error" not in answers[allocator]["setup"], answers[allocator]["setup"]["error"]
    assert answers["shim"]["setup"]["backend"] == "npu_lifetime"
    assert answers["native"]["setup"]["backend"] != "npu_lifetime"
    # the rows' deliberate out-of-memory errors are the shim's only findings
    assert {f["kind"] for f in answers["shim"]["findings"]} <= {"out_of_memory"}, answers["shim"]["findings"]
    assert answers["shim"]["captures_announced"] is True  # no capture-status query per allocation (D19)


@requires_cuda
@pytest.mark.parametrize("row", ROWS)
def test_entry_point_answers_as_torchs(row, answers):
    key = key_of(row)
    native, shim = (answers[a].get(key, {"error": f"not run: {answers[a]['setup']}"}) for a in ("native", "shim"))
    assert native.get("error") is None, native["error"]
    assert shim.get("error") is None, shim["error"]
    COMPARE[key](native, shim)
