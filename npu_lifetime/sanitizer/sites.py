"""Cheap call sites: a capture keeps code objects and line numbers only, and
is formatted when a report needs it (CSAN extracts a full StackSummary on
every access, a large part of its cost)."""
from __future__ import annotations

import importlib.util
import os
import sys
import sysconfig
from typing import Optional

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# tools around the user's code: test runners, launchers, property testing
_TOOL_PACKAGES = ("torch", "functorch", "_pytest", "pytest", "pluggy", "hypothesis", "_hypothesis_pytestplugin")
_INTERNAL: Optional[tuple] = None


def _package_dir(name: str) -> Optional[str]:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.origin:
        return None
    origin = os.path.abspath(spec.origin)
    return os.path.dirname(origin) if spec.submodule_search_locations else origin


def _internal(filename: str) -> bool:
    """Frames of this package, torch, the standard library (weakref
    finalizers, runpy), test runners and console-script launchers
    (``npu-lifetime``, ``pytest``) are not where a user looks."""
    global _INTERNAL
    if _INTERNAL is None:
        paths = sysconfig.get_paths()
        dirs = [_PACKAGE_DIR + os.sep, paths["stdlib"] + os.sep, paths["scripts"] + os.sep]
        dirs += [d for d in map(_package_dir, _TOOL_PACKAGES) if d]
        _INTERNAL = tuple(dirs)
    return filename.startswith("<") or filename.startswith(_INTERNAL)


class Site:
    """The user frames (innermost first) above the point of capture."""

    __slots__ = ("frames",)

    def __init__(self, frames: tuple) -> None:
        self.frames = frames  # ((code, lineno), ...)

    def user_frames(self) -> list:
        out = [(code.co_filename, line, code.co_name) for code, line in self.frames]
        return [f for f in out if not _internal(f[0])]

    def innermost(self) -> str:
        frames = self.user_frames()
        if not frames:
            return "<no user frame: called from C++, e.g. the autograd engine's thread>"
        filename, line, name = frames[0]
        return f"{filename}:{line} in {name}"

    def format(self, limit: int = 6) -> str:
        return "\n".join(
            f'    File "{filename}", line {line}, in {name}' for filename, line, name in reversed(self.user_frames()[:limit])
        )

    def to_json(self) -> list:
        return [{"file": f, "line": line, "function": name} for f, line, name in self.user_frames()]

    def __str__(self) -> str:
        return self.innermost()

    def __repr__(self) -> str:
        return f"Site({self.innermost()})"


class Untracked:
    """The site of a storage allocated before the sanitizer was enabled."""

    __slots__ = ()

    def user_frames(self) -> list:
        return []

    def innermost(self) -> str:
        return "<allocated before the sanitizer was enabled: its allocation was not seen>"

    def format(self, limit: int = 6) -> str:
        return "    " + self.innermost()

    def to_json(self) -> list:
        return [{"file": None, "line": None, "function": self.innermost()}]

    def __str__(self) -> str:
        return self.innermost()

    __repr__ = __str__


UNTRACKED = Untracked()


def key(site) -> object:
    """What identifies a site for grouping findings (equal captures at the
    same code location compare equal)."""
    return site.frames if isinstance(site, Site) else site


def capture(depth: int = 24, skip: int = 1) -> Optional[Site]:
    if depth <= 0:
        return None
    frame = sys._getframe(skip)
    frames = []
    append = frames.append
    for _ in range(depth):
        if frame is None:
            break
        append((frame.f_code, frame.f_lineno))
        frame = frame.f_back
    return Site(tuple(frames))
