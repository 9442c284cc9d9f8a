"""Shared helpers for tests that run schedules through the model and oracle."""
from npu_lifetime.schedules import Schedule, run_model, run_oracle

A, U, W = 0, 1, 2  # allocation stream, usage stream, a third stream
# the model class verdict() and findings() run: run_model's default (model.py's),
# or the one conftest.py's model_both_ways is testing
MODEL = None


def verdict(*steps, streams=3, events=2):
    """(data race?, every free covered?) by the model; the oracle must agree."""
    schedule = Schedule(streams, events, steps)
    found = run_model(schedule, MODEL)
    assert found == run_oracle(schedule), "model and oracle disagree"
    race = any(k[0] == "data_race" for k in found)
    covered = not any(k[0] == "uncovered_free" and k[1] is not None for k in found)
    return race, covered


def findings(*steps, streams=3, events=2):
    schedule = Schedule(streams, events, steps)
    found = run_model(schedule, MODEL)
    assert found == run_oracle(schedule), "model and oracle disagree"
    return found
