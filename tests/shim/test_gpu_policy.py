"""Reuse policies on the GPU: under the default (lazy_wait) the peak does
not depend on host timing; under poll it does (the contrast)."""
from helpers.gpu_helpers import requires_cuda, run_program

pytestmark = requires_cuda


def test_default_policy_peak_is_timing_independent():
    r = run_program("policy_programs.py", "timing_independence", "lazy_wait")
    peaks = set(r["peak_reserved"].values())
    assert len(peaks) == 1, r["peak_reserved"]
    assert r["stream_waits"] > 0 and r["findings"] == []


def test_poll_policy_peak_depends_on_timing():
    r = run_program("policy_programs.py", "timing_independence", "poll")
    assert r["peak_reserved"]["ahead/no-poll"] > r["peak_reserved"]["sync/no-poll"], r["peak_reserved"]
