"""Debug mode on the GPU: the repo's broken hand-offs read the poison (NaN
in the outputs) on every run; the correct ones keep the recipe's outputs."""
from helpers.gpu_helpers import requires_cuda, run_program

pytestmark = requires_cuda


def test_debug_mode_makes_broken_hand_offs_fail_every_run():
    r = run_program("handoff_programs.py", "debug", timeout=600)
    rows = {row["handoff"]: row for row in r["rows"]}
    for name, row in rows.items():
        if name.startswith("broken") and "too late" not in name:
            assert row["nan_runs"] == row["runs"], row
        else:
            assert row["nan_runs"] == 0 and row["same_runs"] == row["runs"], row
    assert r["cost"]["step_ms_debug"] > 0
