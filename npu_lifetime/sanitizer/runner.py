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


@dataclass
class CheckResult:
    findings: list
    report: str
    json: list
    script_failed: bool

    @property
    def exit_code(self) -> int:
        if self.findings:
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
) -> CheckResult:
    from . import LifetimeSanitizer

    device = resolve_device(device)
    if shim:
        from ..shim.install import install

        install(device, policy)
    sanitizer = LifetimeSanitizer(device, on_race=on_race, warn_on_free=False)
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
    return CheckResult(findings, sanitizer.report(findings), sanitizer.to_json(findings), failed)


def write_json(result: CheckResult, path: Optional[str]) -> None:
    if path:
        with open(path, "w") as out:
            json.dump({"findings": result.json, "script_failed": result.script_failed}, out, indent=2)
