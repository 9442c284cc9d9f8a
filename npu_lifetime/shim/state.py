"""What ``install()`` set up in this process (``installed()``), or why it
could not (``InstallError``).  ``install.py`` alone writes it; whoever asks
which device the shim serves (torch's memory functions, record_use, the
sanitizer, the NPU bridge) reads it here without importing the installer."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


class InstallError(RuntimeError):
    pass


@dataclass(frozen=True)
class Installed:
    device: str
    runtime: str
    policy: str
    debug: bool
    library: str
    bridge: Optional[str]  # the torch bridge raising torch.OutOfMemoryError, if built
    hooks: tuple  # the allocator-object setters wired to the shim


_installed: Optional[Installed] = None


def installed() -> Optional[Installed]:
    """What ``install`` set up in this process, if anything."""
    return _installed


def record(setup: Installed) -> Installed:
    """``install``'s outcome: what ``installed()`` answers from now on."""
    global _installed
    _installed = setup
    return setup
