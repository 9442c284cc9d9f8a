"""The FSDP-style hand-off harness on the simulated device: the recipe and
its record_use migration are equally safe, give identical outputs, and
record_use uses no more memory; the recipe's classic mistakes are caught.
The same harness runs on real CUDA streams in test_gpu_handoff.py."""
import re

import pytest
import torch

import npu_lifetime
from npu_lifetime import shim, simdevice as sd
from npu_lifetime.handoff import (
    BrokenDropOutsideOwnerStream,
    BrokenEventTooLate,
    BrokenRecordUseBeforeLastRead,
    BrokenStashDroppedEarly,
    CORRECT,
    EventStash,
    RecipeHandoff,
    RecordStreamHandoff,
    RecordUseHandoff,
    SimHandoffDevice,
    run_handoff,
)
from npu_lifetime.handoff.replay import replay
from npu_lifetime.sanitizer import LifetimeSanitizer
from npu_lifetime.schedules import compare, delay_stream, execute

pytestmark = pytest.mark.usefixtures("both_ways")  # conftest.py: C parts, then Python's


@pytest.fixture
def device(sim_shim):
    return SimHandoffDevice()


def run(device, cls, policy="poll"):
    shim.reset()
    shim.select_runtime("sim")
    shim.set_policy(policy)
    return run_handoff(device, cls, layers=6)


@pytest.fixture
def recipe(device):
    return run(device, RecipeHandoff)


@pytest.mark.parametrize("cls, policy", [
    (RecordStreamHandoff, "poll"), (RecordStreamHandoff, "stream_wait"),
    (RecipeHandoff, "poll"), (RecordUseHandoff, "poll"), (RecordUseHandoff, "stream_wait"),
])
def test_correct_handoffs_have_no_findings_and_identical_outputs(device, recipe, cls, policy):
    result = run(device, cls, policy)
    assert result.findings == []
    assert all(torch.equal(a, b) for a, b in zip(result.outputs, recipe.outputs))


def test_record_use_peak_le_recipe_lt_record_stream(device, recipe):
    record_use = {p: run(device, RecordUseHandoff, p).peak_active_bytes for p in ("poll", "stream_wait")}
    record_stream = run(device, RecordStreamHandoff, "poll").peak_active_bytes
    assert max(record_use.values()) <= recipe.peak_active_bytes < record_stream


@pytest.mark.parametrize("cls", [BrokenDropOutsideOwnerStream, BrokenStashDroppedEarly, BrokenRecordUseBeforeLastRead])
def test_broken_handoffs_are_reported(device, cls):
    result = run(device, cls)
    # the uncovered free, and (where the harness reuses that memory before
    # the consumer is done) the reuse race it leads to
    assert "uncovered_free" in result.finding_kinds
    assert set(result.finding_kinds) <= {"uncovered_free", "reuse_race"}
    assert all(f.usage_stream != getattr(f, "alloc_stream", None) for f in result.findings)


def test_event_recorded_too_late_is_safe_but_over_reserves(device, recipe):
    # the owner waits on an event after the consumer's compute too: no
    # finding, the same memory (it frees after a GPU-side wait); the cost is
    # the owner's stall, measured on the GPU (benchmarks/bench_handoff.py)
    result = run(device, BrokenEventTooLate)
    assert result.findings == [] and result.peak_active_bytes == recipe.peak_active_bytes


def test_event_stash_helper_covers_the_free():
    san = LifetimeSanitizer("sim", on_race="collect", warn_on_free=False)
    with san:
        owner, consumer = sd.Stream(), sd.default_stream()
        stash = EventStash(sd)  # any module with Event and current_stream: torch.cuda too
        with sd.stream(owner):
            x = torch.ones(8)
        consumer.wait_stream(owner)
        with sd.stream(consumer):
            x.sum()
        stash.hold(x, consumer)
        del x
        assert len(stash) == 1
        with sd.stream(owner):
            stash.release()
    assert san.flush() == []


def test_record_use_hand_off_reaches_the_shim(device):
    result = run(device, RecordUseHandoff, "poll")
    assert result.findings == [] and shim.stats()["events_recorded"] > 0  # the harness's record_use attached events


@pytest.mark.parametrize("cls", CORRECT + (BrokenEventTooLate,))
def test_replayed_correct_hand_offs_keep_the_late_read_safe(cls):
    assert not replay(cls).corrupted


@pytest.mark.parametrize("cls", [BrokenDropOutsideOwnerStream, BrokenStashDroppedEarly, BrokenRecordUseBeforeLastRead])
def test_replayed_broken_hand_offs_corrupt_the_late_read(cls):
    r = replay(cls)
    assert r.corrupted
    assert not execute(r.schedule, delay_stream(1), allocator_waits=False).corrupted  # only when the reader lags
    kinds = {key[0] for key in compare(r.schedule).model}
    assert "uncovered_free" in kinds  # the lifetime model agrees on the schedule


def test_handoff_command_explains_every_column_and_row(sim_shim, capsys):
    from npu_lifetime.cli import main

    assert main(["handoff", "--layers", "2", "--width", "32", "--fsdp2", "no"]) == 0
    out = capsys.readouterr().out
    for column in ("hand-off:", "policy:", "findings:", "peak KiB:", "outputs:", "late read:", "verdict:"):
        assert column in out
    assert out.count("uncovered_free") == 3 and len(re.findall("corrupts +poison +ok: caught", out)) == 3
    assert "no finding, by design" in out  # the too-late event row says why it is clean
    assert "as expected" in out and "UNEXPECTED" not in out


def test_handoff_table_columns_line_up_whatever_their_content(sim_shim, capsys):
    from npu_lifetime.cli import main

    assert main(["handoff", "--layers", "2", "--width", "16", "--fsdp2", "no"]) == 0
    lines = capsys.readouterr().out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("hand-off ") and "verdict" in line)
    table = lines[head:head + 1 + sum(1 for line in lines[head + 1:] if "  ok: " in line or "UNEXPECTED" in line)]
    assert any("reuse_race, uncovered_free" in line for line in table)  # the widest findings cell
    for column in ("policy", "findings"):  # left-aligned: every cell starts where its header does
        start = table[0].index(column)
        assert all(line[start - 1] == " " and line[start] != " " for line in table), column
    for column in ("peak KiB", "outputs", "debug"):  # right-aligned: every cell ends where its header does
        end = table[0].index(column) + len(column)
        assert all(line[end - 1] != " " and line[end] == " " for line in table), column


def test_on_sim_the_table_has_no_step_time_and_says_why(sim_shim, capsys):
    """On the simulated device a step's time is Python host work, tenfold
    apart between runs: the table must not show it as data (issue 38, item 9)."""
    from npu_lifetime.cli import main

    assert main(["handoff", "--layers", "2", "--width", "16", "--fsdp2", "no"]) == 0
    out = capsys.readouterr().out
    head = next(line for line in out.splitlines() if line.startswith("hand-off ") and "verdict" in line)
    assert "step" not in head and "ms" not in head.split()
    row = next(line for line in out.splitlines() if line.startswith("recipe "))
    assert not re.search(r"\d+\.\d+ \(\d+\.\d+-\d+\.\d+\)", row), row  # no median (fastest-slowest)
    assert "step time: not shown on the simulated device" in out and "not a measurement" in out


def test_on_a_device_the_table_gives_the_median_step_of_several_with_its_range(sim_shim):
    from npu_lifetime.handoff import SimHandoffDevice, table

    rows, _ = table.handoff_table(SimHandoffDevice(), layers=2, width=16, steps=5)
    assert any("median host time per step over the run's steps (--steps, default 5)" in c
               for c in table.columns("cuda"))
    out = table.format_table(rows, "cuda")
    assert "step ms" in out.splitlines()[0]
    row = next(line for line in out.splitlines() if line.startswith("recipe "))
    median, fastest, slowest = map(float, re.search(r"(\d+\.\d+) \((\d+\.\d+)-(\d+\.\d+)\)", row).groups())
    assert fastest <= median <= slowest


def test_the_late_event_row_is_named_for_what_it_is(sim_shim, capsys):
    from npu_lifetime.cli import main

    assert main(["handoff", "--layers", "2", "--width", "16", "--fsdp2", "no"]) == 0
    out = capsys.readouterr().out
    assert "inefficient: consumer event recorded late" in out and "broken: consumer event" not in out


def test_handoff_command_fails_loudly_when_a_row_misbehaves(sim_shim, capsys, monkeypatch):
    from npu_lifetime.cli import main
    from npu_lifetime.handoff import table

    monkeypatch.setattr(table, "replay", lambda cls: type("R", (), {"corrupted": cls is RecipeHandoff})())
    assert main(["handoff", "--layers", "2", "--width", "16", "--fsdp2", "no"]) == 1
    out = capsys.readouterr().out
    assert "UNEXPECTED: recipe (poll): a correct hand-off misbehaved" in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_handoff_command_without_the_device_says_so(capsys):
    from npu_lifetime.cli import main

    assert main(["handoff", "--device", "cuda"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert main(["handoff", "--fsdp2", "yes"]) == 2
    assert "needs 2 CUDA GPUs" in capsys.readouterr().err


def test_fsdp2_table_formats_every_mode():
    from npu_lifetime.fsdp2 import MODES, RECIPE, RECORD_USE
    from npu_lifetime.handoff.table import format_fsdp2_table

    base = {"losses": [1.0, 0.9, 0.8], "peak_active_bytes": 3 << 20, "step_ms_median": 10.0}
    report = {
        "timing": {RECIPE: base, RECORD_USE: dict(base, peak_active_bytes=2 << 20, step_ms_median=10.1)},
        "sanitizer": {m: {"findings": {"unexpected": {} if m in (RECIPE, RECORD_USE) else
                                       {"uncovered_free: aten::copy on stream": 4,
                                        "uncovered_free: aten::mul on stream": 2,
                                        "reuse_race: aten::add_": 1}}} for m in MODES},
        "pressure": {m: {"corrupted": m not in (RECIPE, RECORD_USE)} for m in MODES},
        "errors": {},
    }
    text = format_fsdp2_table([report, report])
    lines = text.splitlines()
    assert len(lines) == 1 + len(MODES)
    assert "1.010" in lines[2] and "2.0" in lines[2] and "intact" in lines[2]
    # one count per kind: the 2-GPU run printed "uncovered_free x1" eight times over
    assert all("CORRUPTED" in line and "uncovered_free x6, reuse_race x1 " in line for line in lines[3:]), text


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU fallback of the benchmark")
def test_bench_handoff_runs_on_the_simulated_device_without_cuda(sim_shim, capsys):
    from npu_lifetime.cli import main

    assert main(["bench", "handoff", "--rounds", "1", "--steps", "1", "--layers", "2"]) == 0
    out = capsys.readouterr().out
    assert "no CUDA device: the simulated device" in out and "record_use/poll" in out and "recipe/poll" in out
