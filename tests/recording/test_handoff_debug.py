"""Debug mode turns the repo's broken hand-offs into a failure on every run
(the late read sees the poison), on the shim's simulated runtime; without
it the same late read sees the data, and the bug ships."""
import pytest

from npu_lifetime import shim
from npu_lifetime.handoff import poison, recipes

ACTUAL_BUGS = [c for c in recipes.BROKEN if c is not recipes.BrokenEventTooLate]


@pytest.fixture(autouse=True)
def sim_runtime():
    shim.reset()
    shim.select_runtime("sim")
    yield
    shim.reset()


@pytest.mark.parametrize("handoff", ACTUAL_BUGS, ids=lambda c: c.name)
def test_a_broken_hand_off_reads_poison_every_run(handoff):
    assert [poison.late_read(handoff).saw for _ in range(3)] == ["poison"] * 3
    assert [f["kind"] for f in shim.findings()] == []  # the poison is the signal, not a finding


@pytest.mark.parametrize("handoff", [*recipes.CORRECT, recipes.BrokenEventTooLate], ids=lambda c: c.name)
def test_a_correct_hand_off_reads_its_data(handoff):
    assert poison.late_read(handoff).saw == "data"


@pytest.mark.parametrize("handoff", ACTUAL_BUGS, ids=lambda c: c.name)
def test_without_debug_mode_the_same_bug_reads_its_data(handoff):
    assert poison.late_read(handoff, debug=False).saw == "data"
