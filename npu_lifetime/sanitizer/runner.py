"""Runs a user script under the sanitizer (``npu-lifetime check``)."""
from __future__ import annotations

import gc
import json
import runpy
import sys
import traceback
from dataclasses import dataclass
from typing import Optional

EXIT_CLEAN, EXIT_FINDINGS, EXIT_USAGE, EXIT_SCRIPT_FAILED = 0, 1, 2, 3


def resolve_device(device: str) -> str:
    """``auto``: cuda when a GPU is there, else npu when torch_npu sees one,
    else the simulated device."""
    if device != "auto":
        return device
    import torch

    if torch.cuda.is_available():
        return "cuda"
    try:
        import torch_npu  # noqa: F401

        if torch.npu.is_available():
            return "npu"
    except ImportError:
        pass
    return "sim"


class CheckError(Exception):
    """Bad input to ``check`` (no such script, a device this machine lacks):
    nothing was run."""


@dataclass
class CheckResult:
    findings: list
    failing: list  # those that fail the check (every finding under strict)
    report: str
    json: list
    script_failed: bool

    @property
    def exit_code(self) -> int:
        if self.failing:
            return EXIT_FINDINGS
        return EXIT_SCRIPT_FAILED if self.script_failed else EXIT_CLEAN


def check_script(
    script: str,
    args: list,
    device: str = "auto",
    shim: bool = False,
    policy: str = "poll",
    live: bool = True,
    on_race: str = "collect",
    strict: bool = False,
) -> CheckResult:
    """Runs ``script`` under a sanitizer.  Exit code 1 when findings fail
    the check (races, reuse races, actual uncovered frees, invalid frees...;
    with ``strict`` also latent uncovered frees and live uncovered uses)."""
    import os

    from . import DeviceUnavailable, LifetimeSanitizer

    if not os.path.isfile(script):
        raise CheckError(f"no such script: {script!r}")
    device = resolve_device(device)
    try:
        sanitizer = LifetimeSanitizer(device, on_race=on_race, warn_on_free=False, strict=strict)
    except DeviceUnavailable as err:
        raise CheckError(str(err)) from None
    if shim:
        from ..shim.install import install

        install(device, policy)
    saved_argv = sys.argv
    sys.argv = [script, *args]
    failed = False
    namespace: dict = {}
    sanitizer.enable()
    try:
        # the script's globals stay alive until the flush: what they hold is
        # reported as live, not as freed at exit
        namespace = runpy.run_path(script, run_name="__main__")
    except SystemExit as exit_:
        failed = exit_.code not in (None, 0)
    except BaseException:  # the script's own error: report it, still report findings
        traceback.print_exc()
        failed = True
    finally:
        gc.collect()
        findings = sanitizer.flush()
        sanitizer.disable()
        sys.argv = saved_argv
    namespace.clear()
    if not live:
        findings = [f for f in findings if not getattr(f, "live", False)]
    return CheckResult(findings, sanitizer.failing(findings), sanitizer.report(findings),
                       sanitizer.to_json(findings), failed)


def write_json(result: CheckResult, path: Optional[str]) -> None:
    if path:
        with open(path, "w") as out:
            json.dump({"findings": result.json, "failing": len(result.failing),
                       "script_failed": result.script_failed}, out, indent=2)
