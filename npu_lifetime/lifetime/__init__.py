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

# The same model in C++ (native_model.cpp), an optional extension: None where
# it was not built.  LifetimeModel (model.py) stays the default and the
# reference the native one is compared with (tests/test_native_model.py,
# `npu-lifetime fuzz --model native`).
try:
    from ._native_model import LifetimeModel as NativeLifetimeModel
except ImportError:  # not built (no compiler or Python headers at install)
    NativeLifetimeModel = None



def native_available() -> bool:
    """Whether the native lifetime model (``NativeLifetimeModel``) was built."""
    return NativeLifetimeModel is not None

__all__ = [
    "Access",
    "DataRace",
    "Finding",
    "InvalidFree",
    "LifetimeModel",
    "ModelInputError",
    "NativeLifetimeModel",
    "ReuseOutcome",
    "ReuseRace",
    "UncoveredFree",
    "UnrecordedEventWait",
    "UseAfterFree",
    "finding_to_json",
    "native_available",
]
