"""Runs a user script under the sanitizer (``npu-lifetime check``)."""
from __future__ import annotations

import gc
import json
from dataclasses import dataclass
from typing import Callable, Optional

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
    failing: list  # those that fail the check (every race and uncovered free unless silenced explicitly)
    report: str
    json: list
    script_failed: bool
    ending: str = ""  # how the script ended when it failed ("raised ...", "exited with status 3")
    sanitizer: object = None  # the (disabled) LifetimeSanitizer, for one finding's report (snapshot's timeline)

    @property
    def exit_code(self) -> int:
        """By precedence: the script failed (3: a usage error in it must not read as a lifetime
        bug; its findings are still reported and counted), then a failing finding (1), else 0."""
        if self.script_failed:
            return EXIT_SCRIPT_FAILED
        return EXIT_FINDINGS if self.failing else EXIT_CLEAN


def check_script(
    script: str,
    args: list,
    device: str = "auto",
    shim: bool = False,
    policy: str = "poll",
    live: bool = True,
    on_race: str = "collect",
    strict: bool = False,
    allow_latent: bool = False,
    suppressions: Optional[str] = None,
    on_os_exit: Optional[Callable[[CheckResult], int]] = None,
) -> CheckResult:
    """Runs ``script`` under a sanitizer.  Exit code 1 when findings fail
    the check: every race and every uncovered free, latent or actual,
    invalid frees and uses after free, unless silenced explicitly (the
    ``suppressions`` file, default ``$NPU_LIFETIME_SUPPRESSIONS``;
    ``allow_latent``); with ``strict`` also live storages' uncovered uses.
    ``on_os_exit``: when the script calls ``os._exit``, the result so far is
    passed to it (to report), and the process ends with the code it returns."""
    import os

    from .. import user_script
    from . import DeviceUnavailable, LifetimeSanitizer
    from .suppressions import Suppressions, SuppressionsError

    try:
        user_script.check_path(script)
    except user_script.ScriptPathError as err:
        raise CheckError(str(err)) from None
    try:
        rules = Suppressions.load(suppressions or os.environ.get("NPU_LIFETIME_SUPPRESSIONS") or None)
    except SuppressionsError as err:
        raise CheckError(str(err)) from None
    device = resolve_device(device)
    if shim and device not in ("cuda", "npu"):
        raise CheckError(f"--shim installs the allocator shim for cuda or npu; the device here is {device!r} "
                         "(the simulated device's CPU tensors are not the shim's)")
    try:
        sanitizer = LifetimeSanitizer(device, on_race=on_race, warn_on_free=False, strict=strict,
                                      allow_latent=allow_latent, suppressions=rules)
    except DeviceUnavailable as err:
        raise CheckError(str(err)) from None
    if shim:
        from ..shim.install import InstallError, install

        try:
            install(device, policy)
        except (InstallError, ValueError) as err:
            raise CheckError(str(err)) from None
    sanitizer.enable()
    kept: list = []  # the script's globals, alive until the flush: what they hold is live, not freed at exit

    def finish(ending: Optional["user_script.Ending"]) -> Optional[CheckResult]:
        from . import sites

        try:
            with sites.phase("after the script ended (the garbage collector ran before the report)"):
                gc.collect()
            findings = sanitizer.flush()
        finally:
            sanitizer.disable()
            kept.clear()
        if ending is None:
            return None
        if not live:
            findings = [f for f in findings if not getattr(f, "live", False)]
        return CheckResult(findings, sanitizer.failing(findings), sanitizer.report(findings),
                           sanitizer.to_json(findings), ending.failed, ending.how, sanitizer)

    ending = None
    try:
        ending = user_script.run(script, args, keep=kept,
                                 on_os_exit=None if on_os_exit is None else lambda how: on_os_exit(finish(how)))
    finally:
        result = finish(ending)
    return result


def check_json_path(path: Optional[str]) -> None:
    """Refuses a --json path that cannot be written, before anything runs."""
    import os

    if path is None:
        return
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path) or not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise CheckError(f"--json {path}: cannot write there (no such folder, not writable, or a folder)")


def write_json(result: CheckResult, path: Optional[str]) -> None:
    if path:
        with open(path, "w") as out:
            json.dump({"findings": result.json, "failing": len(result.failing),
                       "script_failed": result.script_failed}, out, indent=2)
