"""Property tests: the model against the independent oracle and against a
simulated device that actually reuses freed blocks."""
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npu_lifetime.schedules.properties import executor_violation, oracle_disagreement
from npu_lifetime.strategies import schedules

PROPERTY = settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(schedules(max_streams=4, max_events=3, max_steps=40, misuse=True))
def test_model_findings_equal_the_oracles(schedule):
    problem = oracle_disagreement(schedule)
    assert problem is None, f"{problem}\n{schedule.to_python()}"


@PROPERTY
@given(schedules(max_streams=4, max_events=3, max_steps=40), st.integers(0, 2**32 - 1))
def test_model_verdicts_hold_on_the_simulated_device(schedule, seed):
    problem = executor_violation(schedule, seed)
    assert problem is None, f"{problem}\n{schedule.to_python()}"
