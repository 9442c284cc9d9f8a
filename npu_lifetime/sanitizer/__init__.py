"""The lifetime sanitizer for real torch programs (CUDA, Ascend NPU, and the
simulated device on CPU).

    from npu_lifetime.sanitizer import LifetimeSanitizer
    with LifetimeSanitizer("cuda") as san:
        ...
    print(san.report(san.flush()))

``NPU_LIFETIME_SANITIZER=1`` (or ``=cuda`` / ``=npu`` / ``=sim``) enables one
for the whole process when ``npu_lifetime.sanitizer`` is imported.  Several
sanitizers may be enabled at once (nested blocks, a process sanitizer and a
test's): each sees every event.

Modules: ``sanitizer`` (the sink that feeds one lifetime model),
``dispatch`` (the one dispatch mode), ``hub`` (device events to every
enabled sanitizer), ``backends`` (CUDA, NPU, simulated device), ``accesses``
(reads and writes from schemas), ``collectives`` (c10d semantics),
``storages`` (address -> storage), ``shim_link`` (the shim's hooks),
``reporting`` (grouping, raising, latent/actual), ``report`` (text and
JSON), ``sites``, ``watchers``, ``runner`` (``npu-lifetime check``).
"""
from __future__ import annotations

import os
from typing import Optional

from .backends import DeviceUnavailable
from .sanitizer import DataRaceError, LifetimeSanitizer, LifetimeWarning

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
    "DataRaceError", "DeviceUnavailable", "LifetimeSanitizer", "LifetimeWarning",
    "disable_lifetime_sanitizer", "enable_lifetime_sanitizer", "flush_findings", "process_sanitizer",
]

_enable_from_environment()
