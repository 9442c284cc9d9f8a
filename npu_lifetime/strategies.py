"""Public hypothesis strategies for fuzzing multi-stream code.

    from hypothesis import given
    from npu_lifetime.strategies import schedules

    @given(schedules(max_streams=3))
    def test_my_runtime(schedule): ...

See ``npu_lifetime.schedules`` for the step language.
"""
from .schedules.strategies import build_schedule, raw_steps, schedules

__all__ = ["build_schedule", "raw_steps", "schedules"]
