"""The command line on the real torch_npu (over the stand-in CANN runtime),
with torch_npu's task queue at its default: ``check`` enables the sanitizer
before the script's first NPU op, in a fresh process (it used to hang there:
a trace callback re-entered torch_npu's lazy init); ``snapshot`` installs
the shim.  Nothing here runs on NPU hardware."""
import pickle
import subprocess

from helpers.npu_helpers import PROGRAMS, REPO, npu_environment, require_npu_python
from helpers.pasted_fixes import assert_each_fix_passes
from helpers.scripts import missing_handoff_on


def cli(*args, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([require_npu_python(), "-m", "npu_lifetime.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=npu_environment(), cwd=str(REPO))


def test_check_fails_a_missing_hand_off_on_npu(tmp_path):
    done = cli("check", "--device", "npu", str(missing_handoff_on("npu", tmp_path)))
    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    assert "uncovered free" in done.stdout and "(npu:0)" in done.stdout
    assert "script_missing_handoff.py:" in done.stdout  # the sites are the script's lines


def test_each_suggested_fix_on_npu_pasted_into_the_script_makes_it_pass(tmp_path):
    # torch_npu fires a creation for each of its pool's streams at the first
    # Stream(), the default stream among them: both streams were named
    # `side`, and a fix read `side.wait_stream(side)`
    assert_each_fix_passes(lambda path: cli("check", "--device", "npu", str(path)),
                           missing_handoff_on("npu", tmp_path),
                           ["npu_lifetime.record_use(x, side)", "x.record_stream(side)",
                            "torch.npu.default_stream(0).wait_stream(side)"], tmp_path)


def test_a_data_race_fix_on_npu_pasted_into_the_script_makes_it_pass(tmp_path):
    assert_each_fix_passes(lambda path: cli("check", "--device", "npu", str(path)),
                           PROGRAMS / "script_race.py",
                           ["side.wait_stream(torch.npu.default_stream(0))"], tmp_path)


def test_check_passes_the_record_use_hand_off_on_npu():
    done = cli("check", "--device", "npu", str(PROGRAMS / "script_record_use.py"))
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "no findings" in done.stdout


def test_snapshot_on_npu_writes_the_pictures(tmp_path):
    out = tmp_path / "snap"
    done = cli("snapshot", "--device", "npu", "--out", str(out), str(PROGRAMS / "script_record_use.py"))
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "runtime acl" in done.stdout
    snapshot = pickle.loads(out.with_suffix(".pickle").read_bytes())
    assert snapshot["segments"] and out.with_suffix(".html").read_text().count("<svg") >= 1


def test_each_npu_stream_call_names_its_stream_and_current_stream_costs_nothing():
    from helpers.npu_helpers import program_result, run_npu_program

    r = program_result(run_npu_program("stream_naming.py"))
    assert r["after_current_stream"] == 0 and r["after_two_streams"] == 2, r
    assert r["names"][0].endswith("(`side`)") and r["names"][1].endswith("(`other`)"), r
    assert r["names"][2].endswith("(`launcher`)"), r  # SyncLaunchStream: a class of its own, wrapped too
