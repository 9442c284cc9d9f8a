"""The lifetime sanitizer for real torch programs (CUDA, Ascend NPU, and the
simulated device on CPU).

    from npu_lifetime.sanitizer import LifetimeSanitizer
    with LifetimeSanitizer("cuda") as san:
        ...
    print(san.report(san.flush()))

``NPU_LIFETIME_SANITIZER=1`` (or ``=cuda`` / ``=npu`` / ``=sim``) enables one
for the whole process when ``npu_lifetime.sanitizer`` is imported; at exit
it reports, and findings that fail the check make the exit status 1.  Several
sanitizers may be enabled at once (nested blocks, a process sanitizer and a
test's): each sees every event.

Modules: ``sanitizer`` (the sink that feeds one lifetime model),
``dispatch`` (the one dispatch mode), ``hub`` (device events to every
enabled sanitizer), ``backends`` (CUDA, NPU, simulated device), ``accesses``
(reads and writes from schemas), ``collectives`` (c10d semantics),
``storages`` (address -> storage), ``shim_link`` (the shim's hooks),
``reporting`` (grouping, raising, latent/actual), ``report`` (text and
JSON), ``sites``, ``runner`` (``npu-lifetime check``).  The dispatch mode
publishes the enabled sanitizers to ``npu_lifetime.recording.watchers``,
through which record_use / record_stream / erase_stream reach them.
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


def declare_access(tensor, stream=None, access: str = "read", what: str = "an external call") -> None:
    """States an access the sanitizer cannot see: a library handed
    ``tensor.data_ptr()`` (cuDNN on its handle's stream, NCCL or a kernel
    called directly, ctypes) reads (``access="read"``) or writes
    (``"write"``) its memory on ``stream`` (default: the current stream of
    the tensor's device), from the work queued there now.  Every enabled
    sanitizer then treats it as an op's access: a race it makes and a free
    that does not cover it are reported, naming ``what``.  Without an
    enabled sanitizer it costs a dictionary lookup."""
    import torch

    from ..recording import watchers

    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"declare_access takes a tensor, not {type(tensor).__name__}")
    if access not in ("read", "write"):
        raise ValueError(f"access must be 'read' or 'write', not {access!r}")
    if not isinstance(what, str) or not what:
        raise ValueError(f"what must be a non-empty str naming the call, not {what!r}")
    if not watchers.watching(tensor.device.type):
        return
    if stream is None:
        from .. import simdevice

        stream = (simdevice.current_stream() if tensor.device.type == "cpu"
                  else getattr(torch, tensor.device.type).current_stream(tensor.device))
    watchers.declare_access(tensor, stream, access == "write", what)


def process_sanitizer() -> Optional[LifetimeSanitizer]:
    return _process_sanitizer


def _enable_from_environment() -> None:
    """``NPU_LIFETIME_SANITIZER=1|auto|cuda|npu|sim``: a process-wide sanitizer
    (1 and auto: the device present, else the simulated one); a device this
    machine lacks is one line on stderr and exit status 2.
    Races raise at the access (``DataRaceError``); at exit every finding is
    reported on stderr and, if any fails the check (every race and uncovered
    free unless silenced by ``NPU_LIFETIME_SUPPRESSIONS=FILE`` or
    ``NPU_LIFETIME_ALLOW_LATENT=1``), the process exits with status
    ``NPU_LIFETIME_EXITCODE`` (default 1; 0 only reports)."""
    import sys

    from ..flags import env_choice, env_flag
    from .runner import resolve_device
    from .suppressions import from_environment

    value = env_choice("NPU_LIFETIME_SANITIZER")
    if not value:
        return
    try:
        # 1 (or auto, true, yes, on): the device present, as `check --device auto` picks it
        device = resolve_device("auto" if value in ("1", "auto", "true", "yes", "on") else value)
        enable_lifetime_sanitizer(device, allow_latent=env_flag("NPU_LIFETIME_ALLOW_LATENT"),
                                  suppressions=from_environment())
    except (DeviceUnavailable, ValueError) as err:  # one line and the usage status, not a traceback
        print(f"npu_lifetime: NPU_LIFETIME_SANITIZER={os.environ['NPU_LIFETIME_SANITIZER']}: {err}", file=sys.stderr)
        sys.stderr.flush()
        os._exit(2)
    import atexit

    atexit.register(_report_at_exit)


def _report_at_exit() -> None:
    """Runs last among the exit handlers registered after the sanitizer's
    import: reports, and exits non-zero when findings fail the check."""
    import gc
    import sys

    sanitizer = _process_sanitizer
    if sanitizer is None:
        return
    gc.collect()
    findings = [f for f in sanitizer.flush() if not getattr(f, "live", False)]
    sanitizer.disable()
    if not findings:
        return
    failing = sanitizer.failing(findings)
    print(sanitizer.report(findings), file=sys.stderr)
    try:
        code = int(os.environ.get("NPU_LIFETIME_EXITCODE", "1"))
    except ValueError:
        code = 1
    if failing and code:
        print(f"npu_lifetime: {len(failing)} finding(s) fail the check: exit status {code} "
              "(NPU_LIFETIME_EXITCODE=0 only reports)", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


__all__ = [
    "DataRaceError", "DeviceUnavailable", "LifetimeSanitizer", "LifetimeWarning",
    "disable_lifetime_sanitizer", "enable_lifetime_sanitizer", "flush_findings", "process_sanitizer",
]

_enable_from_environment()
