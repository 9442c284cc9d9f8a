"""The sanitizer's front end (accesses.py) against an independent reference
(frontend_reference.py: observed writes, storage addresses and data
dependence) over torch's OpInfo samples, with the accepted disagreements of
frontend_allowlist.py."""
import pytest
import torch

pytest.importorskip("numpy", reason="torch's op_db needs numpy (the test extras install it)")
pytest.importorskip("expecttest", reason="torch's op_db needs expecttest (the test extras install it)")

from helpers import frontend_reference as reference
from helpers.frontend_allowlist import ALLOWED

aten = torch.ops.aten


@pytest.fixture(scope="module")
def survey():
    found = reference.survey_op_db()
    print("\n" + found.summary())
    return found


def test_op_db_is_covered(survey, record_property):
    record_property("frontend_opinfo", survey.summary())
    assert not survey.errors, "the reference failed:\n" + "\n".join(survey.errors)
    assert survey.opinfos >= 600 and len(survey.analyses) >= 800, survey.summary()
    assert survey.verdicts["read"] > 3000 and survey.verdicts["written"] > 800, survey.summary()


def test_every_disagreement_is_allow_listed(survey):
    unlisted = {key: where for key, where in survey.disagreements().items() if key not in ALLOWED}
    assert not unlisted, ("the front end and the reference disagree (fix accesses.py, or allow-list with a "
                          "reason in frontend_allowlist.py):\n"
                          + "\n".join(f"  {key}    (first in {where})" for key, where in unlisted.items()))


def test_no_allow_listed_disagreement_is_stale(survey):
    stale = sorted(set(ALLOWED) - set(survey.disagreements()))
    assert not stale, "no longer disagree: remove from frontend_allowlist.py:\n  " + "\n  ".join(stale)


def test_every_allow_listed_disagreement_gives_a_reason():
    assert all(isinstance(reason, str) and len(reason) > 40 for reason in ALLOWED.values())


# -- the reference itself ------------------------------------------------------------------------------------------
def observe(func, *args, **kwargs):
    inputs = reference.input_storages(func, args, kwargs)
    ref = reference.reference(func, args, kwargs, inputs)
    names = {ptr: entry.label for ptr, entry in inputs.items()}
    return ({names[p] for p in ref.written}, {names[p]: depends for p, depends in ref.read.items()},
            set(ref.fresh))


def test_reference_sees_reads_writes_and_fresh_outputs():
    a, b = torch.randn(4), torch.randn(4)
    assert observe(aten.add.Tensor, a, b) == (set(), {"self": True, "other": True}, {"output 0"})
    written, read, fresh = observe(aten.add_.Tensor, a.clone(), b)
    assert written == {"self"} and read["other"] and not fresh
    assert observe(aten.zeros_like.default, a)[1] == {"self": False}  # its shape only
    assert observe(aten.view.default, a, [2, 2])[2] == set()  # an alias, not a fresh output
    written, _, _ = observe(aten.native_batch_norm.default, torch.randn(4, 3), None, None,
                            torch.zeros(3), torch.ones(3), True, 0.1, 1e-5)
    assert written == {"running_mean", "running_var"}  # the schema does not say so


def test_reference_sees_an_out_tensor_the_op_resizes_as_fresh():
    a = torch.randn(4)
    written, _, fresh = observe(aten.add.out, a, a, out=torch.empty(0))
    assert fresh == {"output 0", "out"} and not written


def test_a_front_end_that_misses_accesses_is_caught(monkeypatch):
    monkeypatch.setattr(reference, "front_end", lambda func, args, kwargs, run: (run(), []))
    found = reference.survey_op_db(names={"add"}, samples_per_op=1)
    assert {"aten::add.Tensor: missed-read self", "aten::add.Tensor: missed-read other",
            "aten::add.Tensor: missed-write output 0", "aten::add.out: missed-write out",
            "aten::add_.Tensor: missed-write self"} <= set(found.disagreements())


def test_a_front_end_that_writes_everything_is_caught(monkeypatch):
    def writes_everything(func, args, kwargs, run):
        outputs, found = reference.__dict__["_real_front_end"](func, args, kwargs, run)
        for access in found:
            access.is_write = True
        return outputs, found

    monkeypatch.setitem(reference.__dict__, "_real_front_end", reference.front_end)
    monkeypatch.setattr(reference, "front_end", writes_everything)
    found = reference.survey_op_db(names={"add"}, samples_per_op=1)
    assert {"aten::add.Tensor: write-not-observed self", "aten::add.Tensor: write-not-observed other"} <= set(
        found.disagreements())
