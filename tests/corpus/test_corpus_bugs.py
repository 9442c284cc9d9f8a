"""The corpus of publicly reported cross-stream bugs (npu_lifetime/corpus) on
the simulated device: every buggy form fails `check` by default, its report
names the streams, the buffer and a fix, and every fixed form passes; the
known gap stays a gap.  The table's own judgement is tested on made-up rows,
so a wrong verdict cannot pass as caught."""
import re
import subprocess
import sys

import pytest

from npu_lifetime.corpus import case_modules
from npu_lifetime.corpus import oracle
from npu_lifetime.corpus import table
from npu_lifetime.corpus.verdicts import Verdict

CASES = case_modules()


def test_at_least_eight_public_bugs_each_citing_its_thread():
    threads = {t for m in CASES.values() for t in m.CASE.threads}
    assert len([m for m in CASES.values() if not m.CASE.gap]) >= 8
    for name, module in CASES.items():
        assert module.CASE.threads, name
        for thread in module.CASE.threads:
            assert re.fullmatch(r"[\w.-]+/[\w.-]+#\d+", thread), thread
            assert thread in module.__doc__ or thread.split("#")[1] in module.__doc__, (name, thread)
    assert len(threads) >= 8


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_case_on_sim(name):
    row, = table.build("sim", [name])
    case = row.case
    if case.gap:
        assert row.status == "known gap", (row.status, row.buggy.report)
        for form in case.also_buggy:  # the bug kept, the access declared: caught
            assert row.verdicts[form].exit_code == 1 and case.finding in row.verdicts[form].kinds
        return
    assert row.status == "caught", (row.status, row.buggy.named, row.buggy.report)
    assert row.buggy.exit_code == 1 and case.finding in row.buggy.kinds
    named = row.buggy.named
    assert case.producer in named["producer"] and case.consumer in named["consumer"]
    # the fix names the stream it orders after by the program's variable (or the default stream's call)
    after = case.consumer if case.finding == "uncovered_free" else case.producer
    assert (after if after != "default" else "default_stream") in named["fix"], named["fix"]
    for form, verdict in row.verdicts.items():
        if form != "buggy":
            assert verdict.exit_code == 0, (form, verdict.report)


def _row(buggy_exit, kinds, fixed_exit=0, gap=""):
    case = CASES["vllm_ascend_sampler_q"].CASE
    if gap:
        from dataclasses import replace

        case = replace(case, gap=gap)
    named = {"producer": "sim stream 1 (`sampling`)", "consumer": "sim default stream", "buffer": "q",
             "overwrite": "", "fix": "npu_lifetime.record_use(q, s)"}
    return table.Row(case, {"buggy": Verdict(buggy_exit, kinds, named if kinds else {}),
                            "upstream": Verdict(fixed_exit, []), "record_use": Verdict(0, [])})


def test_the_table_calls_a_miss_or_a_flagged_fix_wrong():
    assert _row(1, ["uncovered_free"]).status == "caught"
    assert _row(0, []).status.startswith("WRONG")  # a missed bug
    assert _row(1, ["data_race"]).status.startswith("WRONG")  # reported as the wrong kind
    assert _row(1, ["uncovered_free"], fixed_exit=1).status.startswith("WRONG")  # a fix flagged
    assert _row(0, [], gap="raw pointers").status == "known gap"
    assert not table.all_as_expected([_row(0, [])])
    wrong_names = _row(1, ["uncovered_free"])
    wrong_names.buggy.named["consumer"] = "sim stream 2 (`other`)"
    assert wrong_names.status.startswith("WRONG")


def test_corruption_and_oracle_judgement():
    row = _row(1, ["uncovered_free"])
    row.corruption = {"buggy": False, "upstream": True, "record_use": True}
    row.oracle = {"buggy": 1, "upstream": 0, "record_use": 0}
    assert row.corruption_ok and row.oracle_agrees
    row.corruption["buggy"] = True  # the bug never showed in the data
    row.oracle["upstream"] = 2  # compute-sanitizer flags a fix
    assert row.corruption_ok is False and row.oracle_agrees is False


def test_oracle_reads_compute_sanitizers_summary():
    assert oracle.errors("========= Use-after-free on allocation\n========= ERROR SUMMARY: 4 errors\n") == 4
    assert oracle.errors("========= ERROR SUMMARY: 0 errors\n") == 0
    assert oracle.errors("========= ERROR SUMMARY: 1 error\n") == 1
    assert oracle.errors("Traceback (most recent call last): ...") is None  # no summary: not a clean run
    race = table.Row(CASES["rocm_transfer_stream_copy"].CASE, {})
    race.oracle = {"buggy": 0, "upstream": 0}
    assert race.oracle_agrees is None  # an ordering race it does not track: no verdict
    race.oracle = {"buggy": 1, "upstream": 0}
    assert race.oracle_agrees is True
    race.oracle = {"buggy": 0, "upstream": 1}
    assert race.oracle_agrees is False
    gap = table.Row(CASES["cudnn_raw_pointer_workspace"].CASE, {})
    gap.oracle = {"buggy": 0, "declared": 0, "upstream": 0, "record_use": 0}
    assert gap.oracle_agrees is None  # raw-pointer copies are checked when called: no verdict
    row = _row(1, ["uncovered_free"])
    row.oracle = {"buggy": 1, "upstream": None, "record_use": 0}
    assert row.oracle_agrees is False


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "npu_lifetime.cli", "corpus", *args],
                          capture_output=True, text=True, timeout=600)


def test_corpus_command_prints_the_table():
    done = _cli("--case", "vllm_ascend_sampler_q", "--case", "cudnn_raw_pointer_workspace")
    assert done.returncode == 0, done.stderr
    assert "vllm_ascend_sampler_q  [caught]" in done.stdout
    assert "vllm-project/vllm-ascend#13396" in done.stdout
    assert "cudnn_raw_pointer_workspace  [known gap]" in done.stdout
    assert "2 cases: 1 caught, 1 known gap(s), 0 wrong" in done.stdout


@pytest.mark.parametrize("args, message", [
    (["--case", "nope"], "no case nope"),
    (["--corruption"], "--corruption runs on cuda or npu"),
    (["--compute-sanitizer"], "--compute-sanitizer runs on cuda"),
])
def test_corpus_command_refuses_bad_input(args, message):
    done = _cli(*args)
    assert done.returncode == 2 and message in done.stderr, done.stderr


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without a GPU")
def test_a_device_this_machine_lacks_is_one_line_and_exit_2():
    done = _cli("--device", "cuda")
    assert done.returncode == 2 and "no CUDA device" in done.stderr and "Traceback" not in done.stderr, done.stderr
