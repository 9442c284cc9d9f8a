"""``npu-lifetime fuzz``: exit codes, reproducers, parallel workers."""
import pytest

from npu_lifetime.cli import main
from npu_lifetime.lifetime import model as model_module


def test_fuzz_passes_on_the_real_model(capsys):
    assert main(["fuzz", "-n", "300", "-j", "1", "-q", "--execute"]) == 0
    assert "checked 300 schedules" in capsys.readouterr().out


def test_fuzz_in_parallel_workers(capsys):
    assert main(["fuzz", "-n", "600", "-j", "2", "-q"]) == 0
    assert "0 disagreements" in capsys.readouterr().out


def test_fuzz_reports_a_minimal_runnable_reproducer(monkeypatch, capsys):
    # a deliberately broken rule: record_use covers nothing
    monkeypatch.setattr(model_module.LifetimeModel, "record_use", lambda self, storage, stream, site=None: None)
    assert main(["fuzz", "-n", "5000", "-j", "1", "-q"]) == 1
    out = capsys.readouterr().out
    assert "1 disagreement" in out
    snippet = out.split("# reproducer\n", 1)[1]
    assert "RecordUse(" in snippet and len(snippet.splitlines()) < 15  # shrunk
    exec(snippet, {})
    assert "DISAGREE" in capsys.readouterr().out


def test_fuzz_shows_progress(capsys):
    main(["fuzz", "-n", "500", "-j", "1"])
    assert "fuzz: 500/500 schedules" in capsys.readouterr().err


@pytest.mark.parametrize("bad", [["-n", "0"], ["-j", "0"], ["--max-streams", "0"]])
def test_fuzz_rejects_bad_arguments(bad, capsys):
    assert main(["fuzz", *bad]) == 2
    assert "must be at least 1" in capsys.readouterr().err


def test_fuzz_says_what_it_compares_and_what_it_generated(capsys):
    assert main(["fuzz", "-n", "400", "-j", "1", "-q"]) == 0
    out = capsys.readouterr().out
    assert "compared: the lifetime model vs its independent oracle" in out
    assert "steps/min" in out and "steps per schedule: min" in out
    assert "step kinds:" in out and "op " in out and "adopt " in out and "delete_event " in out
    assert "spawn " in out and "switch " in out and "join " in out
    assert "events inside ops:" in out and "reuse_race" in out


@pytest.mark.parametrize("broken, what", [
    # reuse races: the model forgets to check new owners
    ("npu_lifetime.lifetime.model.LifetimeModel._check_reuse", lambda self, *a: None),
    # ops: their accesses fed before their own in-op events (the old front end's fault)
    ("npu_lifetime.schedules.runner.access_point", lambda events, stream: 0),
    # host threads: the model keeps one host clock for every thread
    ("npu_lifetime.lifetime.model.LifetimeModel.set_host", lambda self, host: None),
    # data races: an access checked against the last write only (nor a write against reads)
    ("npu_lifetime.lifetime.model._races", lambda storage, s, acc, vc, priors, found: {}),
])
def test_the_oracle_catches_a_broken_rule(monkeypatch, capsys, broken, what):
    monkeypatch.setattr(broken, what)
    assert main(["fuzz", "-n", "20000", "-j", "1", "-q"]) == 1
    out = capsys.readouterr().out
    assert "1 disagreement" in out
    snippet = out.split("# reproducer\n", 1)[1]
    assert len(snippet.splitlines()) < 20  # shrunk
