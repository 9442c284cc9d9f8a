"""Cross-stream reuse on a real GPU (issue 39), each mode in a fresh
process: a busy stream's free segment moves only in always mode, behind a
GPU-side wait that keeps the old owner's late write before the new
owner's; once every stream is idle, idle and always move a segment with no
wait; off moves nothing.  Skipped without CUDA."""
import pytest

from helpers.gpu_helpers import requires_cuda, run_program

pytestmark = requires_cuda


@pytest.mark.parametrize("mode", ["off", "idle", "always"])
def test_a_busy_streams_segment_moves_only_behind_a_wait(mode):
    r = run_program("cross_stream_programs.py", "busy_donor", mode)
    assert r["mode"] == mode and r["findings"] == []
    assert r["y_ok"] and r["z_ok"]  # no late write of an old owner landed on a new one
    busy = r["busy_take"]
    if mode == "always":
        assert busy["same_address"] and busy["moved"] == 1 and busy["waits"] >= 1
    else:
        assert not busy["same_address"] and busy["moved"] == 0
    if mode == "off":
        assert r["idle_take"]["moved"] == 0
    else:  # the third stream takes an idle segment (the donor's or the taker's), without a wait
        assert r["idle_take"]["moved"] == 1 and r["idle_take"]["waits"] == 0
