"""``npu-lifetime check`` exit codes and JSON, and the pytest plugin, on the
simulated device."""
import json

from npu_lifetime.cli import main
from helpers.scripts import REUSED, USER_HANDOFF, forgotten_handoff, run_user_tests, write_script


def test_check_fails_on_a_latent_free_and_says_it_is_latent(tmp_path, capsys):
    out = tmp_path / "report.json"
    path = write_script(tmp_path, forgotten_handoff())
    assert main(["check", "--device", "sim", "--json", str(out), path]) == 1
    text = capsys.readouterr().out
    assert "1 fail the check" in text and "[uncovered free, latent]" in text
    assert "why latent:    the memory was not reused while the sanitizer watched" in text
    [finding] = json.loads(out.read_text())["findings"]
    assert finding["kind"] == "uncovered_free" and finding["last_use"]["op"] == "aten::mul"
    assert finding["fails"] is True and finding["actual"] is False
    # silenced only explicitly: --allow-latent lets a latent free pass, and the report says so
    assert main(["check", "--device", "sim", "--allow-latent", "--json", str(out), path]) == 0
    text = capsys.readouterr().out
    assert "0 fail the check, 1 latent allowed (--allow-latent)" in text and "[uncovered free, latent]" in text
    [finding] = json.loads(out.read_text())["findings"]
    assert finding["fails"] is False and finding["not_failing"].startswith("latent")


def test_check_fails_on_a_reuse_race_and_the_free_it_made_actual(tmp_path, capsys):
    out = tmp_path / "report.json"
    assert main(["check", "--device", "sim", "--json", str(out), write_script(tmp_path, REUSED)]) == 1
    text = capsys.readouterr().out
    assert "reused True" in text  # the memory really went to a new owner
    kinds = {f["kind"]: f for f in json.loads(out.read_text())["findings"]}
    assert kinds["reuse_race"]["access"]["op"] == "aten::fill_" and kinds["reuse_race"]["fails"]
    assert kinds["uncovered_free"]["actual"] is True and kinds["uncovered_free"]["fails"] is True
    assert "[reuse race]" in text and "[uncovered free, ACTUAL" in text


def test_check_rejects_a_missing_script_and_an_absent_device(tmp_path, capsys):
    assert main(["check", "--device", "sim", str(tmp_path / "missing.py")]) == 2
    assert "no such script" in capsys.readouterr().err
    if not __import__("torch").cuda.is_available():
        assert main(["check", "--device", "cuda", write_script(tmp_path, "print('ran')")]) == 2
        captured = capsys.readouterr()
        assert "no CUDA device" in captured.err and "ran" not in captured.out


def test_check_exits_0_when_clean(tmp_path, capsys):
    path = write_script(tmp_path, forgotten_handoff("npu_lifetime.record_use(x, side)"))
    assert main(["check", "--device", "sim", path]) == 0
    assert "no findings" in capsys.readouterr().out


def test_check_exits_3_when_the_script_fails_cleanly(tmp_path):
    assert main(["check", "--device", "sim", write_script(tmp_path, "raise SystemExit(4)")]) == 3
    assert main(["check", "--device", "sim", write_script(tmp_path, "1 / 0", "boom.py")]) == 3


def test_check_passes_arguments_to_the_script(tmp_path, capsys):
    path = write_script(tmp_path, "import sys; print('args', sys.argv[1:])")
    assert main(["check", "--device", "sim", path, "--flag", "7"]) == 0
    assert "args ['--flag', '7']" in capsys.readouterr().out


def test_check_live_storages_are_listed_and_fail_only_when_strict(tmp_path, capsys):
    body = forgotten_handoff().replace("del x", "keep = x")
    path = write_script(tmp_path, body)
    assert main(["check", "--device", "sim", path]) == 0  # nothing was freed
    assert "[uncovered use, still alive]" in capsys.readouterr().out
    assert main(["check", "--device", "sim", "--strict", path]) == 1
    assert main(["check", "--device", "sim", "--strict", "--no-live", path]) == 0


PLUGIN_TESTS = f"""
import gc
import pytest
import torch
import npu_lifetime
from npu_lifetime import simdevice as sd
{USER_HANDOFF}
@pytest.mark.lifetime_sanitizer(device="sim", strict=True)
def test_buggy():
    handoff(fix=False)

@pytest.mark.lifetime_sanitizer(device="sim")
def test_latent_fails_by_default():
    handoff(fix=False)

@pytest.mark.lifetime_sanitizer(device="sim", allow_latent=True)
def test_latent_allowed_explicitly():
    handoff(fix=False)

@pytest.mark.lifetime_sanitizer(device="sim", strict=True)
def test_fails_an_assertion_too():
    handoff(fix=False)
    assert 1 == 2, "the test's own failure"

@pytest.mark.lifetime_sanitizer(device="sim")
def test_fixed():
    handoff(fix=True)

def test_unmarked_is_not_checked():
    handoff(fix=False)

@pytest.mark.lifetime_sanitizer(device="sim")
def test_fixture(lifetime_sanitizer):
    assert lifetime_sanitizer.enabled and lifetime_sanitizer.backend.device_type == "cpu"
    handoff(fix=True)
"""


def test_pytest_plugin_fails_tests_with_findings(tmp_path):
    done = run_user_tests(tmp_path, PLUGIN_TESTS)
    assert "3 failed, 4 passed" in done.stdout, done.stdout + done.stderr
    assert "FAILED test_user.py::test_buggy" in done.stdout and "[uncovered free, latent]" in done.stdout
    assert "FAILED test_user.py::test_latent_fails_by_default" in done.stdout
    # the assertion stays the failure, and the lifetime findings are kept with it
    failure = done.stdout.split("test_fails_an_assertion_too _")[1].split("short test summary")[0]
    assert "the test's own failure" in failure and "npu_lifetime" in failure and "[uncovered free" in failure
    # the report is printed once per failing test
    buggy = done.stdout.split("_ test_buggy _")[1].split("_ test_latent_fails_by_default _")[0]
    assert buggy.count("[uncovered free, latent]") == 1, buggy


def test_snapshot_shows_blocks_streams_and_events(tmp_path, capsys, sim_shim):
    path = write_script(tmp_path, """
        from npu_lifetime import shim
        p = shim.alloc(4096, 0, 0x10)
        shim.record_stream(p, 0x30)
        shim.record_use(p, 0x20)
    """)
    assert main(["snapshot", "--device", "sim", path]) == 0
    out = capsys.readouterr().out
    assert "runtime sim, policy poll" in out and "live 1 blocks / 4096 B" in out
    assert "recorded 0x30 use events 0x20" in out


def test_bench_runs_a_benchmark_script_and_lists_unknown_names(capsys):
    assert main(["bench", "model", "--rounds", "200", "--repeats", "1"]) == 0
    assert "median us" in capsys.readouterr().out
    assert main(["bench", "nope"]) == 2
    err = capsys.readouterr().err
    assert "no benchmark 'nope'" in err and "model" in err and "shim_alloc" in err


def test_sites_show_user_frames_only(tmp_path):
    """No launcher, runpy, CLI or pytest frame in any site: only the script's."""
    out = tmp_path / "report.json"
    path = write_script(tmp_path, forgotten_handoff())
    main(["check", "--device", "sim", "--json", str(out), path])
    [finding] = json.loads(out.read_text())["findings"]
    sites = [finding["alloc_site"], finding["free_site"], finding["last_use"]["site"]]
    files = {frame["file"] for site in sites for frame in site}
    assert files == {path}, files
