"""The benchmarks' paired ratios: a slow moment of the host that lands on
one round must weigh on both sides of that round's ratio, not on one
figure of a ratio of medians (bench_record_use's summary against the event
record timed in the same round; bench_cross_stream's pipeline against
torch's allocator in the same round)."""
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load(name):
    spec = importlib.util.spec_from_file_location(f"{name}_under_test", ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_record_use_ratios_are_paired_by_round():
    bench = _load("bench_record_use")
    # round 2 is a slow moment for everything: the medians' ratio reads 1.5 / 1.0, the paired one 1.1
    rounds = {"event_record": [1.0, 2.0, 1.0], "record_use": [1.1, 2.2, 1.5], "event_record, again": [1.0, 2.0, 1.4]}
    result = {"allocator": "a", "us": {k: sorted(v)[1] for k, v in rounds.items()}, "rounds": rounds}
    row = next(r for r in bench.summary([result]) if r["name"] == "record_use under the shim")
    assert row["paired"] and row["ratio"] == pytest.approx(1.1)  # 1.1/1.0, 2.2/2.0, 1.5/1.2: median 1.1
    assert row["met"]
    unpaired = {k: v for k, v in result.items() if k != "rounds"}
    row = next(r for r in bench.summary([unpaired]) if r["name"] == "record_use under the shim")
    assert not row["paired"] and row["ratio"] == pytest.approx(1.5 / 1.0) and not row["met"]


def test_the_pipeline_is_compared_with_torch_round_by_round():
    bench = _load("bench_cross_stream")
    runs = {"torch": [{"step_ms": 1.0}, {"step_ms": 2.0}, {"step_ms": 1.0}],
            "shim": [{"step_ms": 0.9}, {"step_ms": 1.9}, {"step_ms": 1.2}]}
    paired = bench.paired_to_torch(runs)
    assert paired["torch"] == 1.0 and paired["shim"] == pytest.approx(0.95)  # 0.9, 0.95, 1.2
    assert bench.paired_to_torch({"shim": runs["shim"]}) == {}  # no torch rounds: nothing to pair with
