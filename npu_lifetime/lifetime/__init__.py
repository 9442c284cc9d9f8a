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
from ..native_parts import load
from .model import LifetimeModel, ModelInputError

# The same model in C++ (native_model.cpp), an optional extension: None where
# it was not built.  LifetimeModel (model.py) stays the default and the
# reference the native one is compared with (tests/model/test_native_model.py,
# `npu-lifetime fuzz --model native`).
# Loaded through native_parts like every extension: NPU_LIFETIME_NATIVE=0 turns it off too.
_native = load(f"{__name__}._native_model")
NativeLifetimeModel = _native.LifetimeModel if _native is not None else None

MODELS = ("python", "native")


def native_available() -> bool:
    """Whether the native lifetime model (``NativeLifetimeModel``) was built."""
    return NativeLifetimeModel is not None


def model_class(model: str) -> type:
    """The lifetime model class named ``python`` (LifetimeModel, the
    reference) or ``native`` (NativeLifetimeModel, the same model in C++)."""
    if model not in MODELS:
        raise ValueError(f"model must be one of {MODELS}, not {model!r}")
    if model == "python":
        return LifetimeModel
    if NativeLifetimeModel is None:
        raise RuntimeError("the native lifetime model (npu_lifetime.lifetime._native_model) is not built: "
                           "pip install -e . (or python setup.py build_ext --inplace) with a C++ compiler")
    return NativeLifetimeModel

__all__ = [
    "Access",
    "DataRace",
    "Finding",
    "InvalidFree",
    "LifetimeModel",
    "MODELS",
    "ModelInputError",
    "NativeLifetimeModel",
    "ReuseOutcome",
    "ReuseRace",
    "UncoveredFree",
    "UnrecordedEventWait",
    "UseAfterFree",
    "finding_to_json",
    "model_class",
    "native_available",
]
