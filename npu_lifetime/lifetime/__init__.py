"""The lifetime model (pure Python, no torch): happens-before and coverage."""
from .findings import (
    Access,
    DataRace,
    Finding,
    InvalidFree,
    ReuseOutcome,
    ReuseRace,
    UncoveredFree,
    UnrecordedEventWait,
    UseAfterFree,
    finding_to_json,
)
from .model import LifetimeModel, ModelInputError

__all__ = [
    "Access",
    "DataRace",
    "Finding",
    "InvalidFree",
    "LifetimeModel",
    "ModelInputError",
    "ReuseOutcome",
    "ReuseRace",
    "UncoveredFree",
    "UnrecordedEventWait",
    "UseAfterFree",
    "finding_to_json",
]
