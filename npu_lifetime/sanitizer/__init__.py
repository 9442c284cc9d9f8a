"""The lifetime sanitizer for real torch programs (CUDA, Ascend NPU, and the
simulated device on CPU).

    from npu_lifetime.sanitizer import LifetimeSanitizer
    with LifetimeSanitizer("cuda") as san:
        ...
    print(san.report(san.flush()))

``NPU_LIFETIME_SANITIZER=1`` (or ``=cuda`` / ``=npu`` / ``=sim``) enables one
for the whole process when ``npu_lifetime.sanitizer`` is imported.
"""
from __future__ import annotations

import os
from typing import Optional

from .frontend import DataRaceError, LifetimeSanitizer, LifetimeWarning

_process_sanitizer: Optional[LifetimeSanitizer] = None


def enable_lifetime_sanitizer(device: str = "cuda", **options) -> LifetimeSanitizer:
    """Enables a process-wide sanitizer (like ``enable_cuda_sanitizer``)."""
    global _process_sanitizer
    if _process_sanitizer is None:
        _process_sanitizer = LifetimeSanitizer(device, **options)
    return _process_sanitizer.enable()


def disable_lifetime_sanitizer() -> None:
    if _process_sanitizer is not None:
        _process_sanitizer.disable()


def flush_findings() -> list:
    """Retained findings of the process-wide sanitizer plus, for live
    storages, uses a free now would leave uncovered (as torch_npu's
    ``flush_record_stream_warnings``)."""
    return [] if _process_sanitizer is None else _process_sanitizer.flush()


def process_sanitizer() -> Optional[LifetimeSanitizer]:
    return _process_sanitizer


def _enable_from_environment() -> None:
    value = os.environ.get("NPU_LIFETIME_SANITIZER", "").strip().lower()
    if value in ("", "0", "false", "off"):
        return
    enable_lifetime_sanitizer("cuda" if value in ("1", "true", "on") else value)


__all__ = [
    "DataRaceError", "LifetimeSanitizer", "LifetimeWarning", "disable_lifetime_sanitizer",
    "enable_lifetime_sanitizer", "flush_findings", "process_sanitizer",
]

_enable_from_environment()
