"""Runs the model and the oracle on one schedule and says whether they agree."""
from __future__ import annotations

from dataclasses import dataclass

from ..lifetime import model_class
from .oracle import run_oracle
from .runner import run_model
from .schedule import Schedule


@dataclass(frozen=True)
class Comparison:
    model: list
    oracle: list

    @property
    def agree(self) -> bool:
        return self.model == self.oracle

    def __str__(self) -> str:
        if self.agree:
            return f"model and oracle agree: {self.model}"
        only_model = [k for k in self.model if k not in self.oracle]
        only_oracle = [k for k in self.oracle if k not in self.model]
        return (
            "model and oracle DISAGREE\n"
            f"  only the model reports:  {only_model}\n"
            f"  only the oracle reports: {only_oracle}"
        )


def compare(schedule: Schedule, model: str = "python") -> Comparison:
    """``model``: ``python`` (lifetime.LifetimeModel, the reference) or
    ``native`` (lifetime.NativeLifetimeModel, the same model in C++)."""
    return Comparison(run_model(schedule, model_class(model)), run_oracle(schedule))

