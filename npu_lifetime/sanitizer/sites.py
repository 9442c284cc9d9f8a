"""Cheap call sites: a capture keeps code objects and line numbers only, and
is formatted when a report needs it (CSAN extracts a full StackSummary on
every access, a large part of its cost)."""
from __future__ import annotations

import os
import sys
import sysconfig
from typing import Optional

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_INTERNAL: Optional[tuple] = None


def _internal(filename: str) -> bool:
    """Frames of this package, torch, and the standard library (weakref
    finalizers, runpy) are not where a user looks."""
    global _INTERNAL
    if _INTERNAL is None:
        import torch

        _INTERNAL = (
            _PACKAGE_DIR,
            os.path.dirname(os.path.abspath(torch.__file__)),
            sysconfig.get_paths()["stdlib"],
        )
    return filename.startswith(_INTERNAL)


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
