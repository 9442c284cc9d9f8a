"""Cheap call sites: a capture keeps the code objects and line numbers of
the user's frames only (whether a code object is the user's is decided once
per code object), stops after ``depth`` of them, and is formatted only when
a report needs it (CSAN extracts a full StackSummary on every access, a
large part of its cost).  Frames of this package, torch, the standard
library, test runners and launchers are never kept; the walk passes through
torch and this package (user code called back from torch, e.g. a module's
``forward``) but stops at the first frame of the code that runs the user's
(a test runner, ``runpy``, a launcher) once a user frame was found."""
from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import sysconfig
import threading
from typing import Optional

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_DEMO = os.path.join(_PACKAGE_DIR, "viz", "demo.py")
# code the user's code runs inside: the walk passes through it
_PASS_THROUGH_PACKAGES = ("torch", "functorch")
# code that runs the user's: test runners, property testing
_RUNNER_PACKAGES = ("_pytest", "pytest", "pluggy", "hypothesis", "_hypothesis_pytestplugin")
_INTERNAL: Optional[tuple] = None
_RUNNERS: Optional[tuple] = None
_USER, _PASS, _RUNNER, _LIBRARY = 0, 1, 2, 3
_LIBRARY_FRAMES = 8  # innermost library (torch) frames kept per site: suppressions match them
_LIBRARY_NOISE = ("_ops.py", "_python_dispatch.py", "_compile.py", "eval_frame.py", "_jit_internal.py")
_LIBRARIES: Optional[tuple] = None


def _package_dir(name: str) -> Optional[str]:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.origin:
        return None
    origin = os.path.abspath(spec.origin)
    return os.path.dirname(origin) if spec.submodule_search_locations else origin


def _classify(filename: str) -> int:
    """User code, code it runs inside (this package, torch, the standard
    library: weakref finalizers, contextlib), or code that runs it (test
    runners, ``runpy``, console-script launchers such as ``npu-lifetime``).
    Library code (torch) is passed through like this package's, but its
    innermost frames are kept apart for suppressions and reports."""
    global _INTERNAL, _RUNNERS, _LIBRARIES
    if _INTERNAL is None:
        paths = sysconfig.get_paths()
        stdlib = paths["stdlib"] + os.sep
        _RUNNERS = (os.path.join(stdlib, "runpy.py"), paths["scripts"] + os.sep,
                    os.path.join(_PACKAGE_DIR, "cli.py"), os.path.join(_PACKAGE_DIR, "sanitizer", "runner.py"),
                    os.path.join(_PACKAGE_DIR, "user_script.py"),
                    *filter(None, map(_package_dir, _RUNNER_PACKAGES)))
        _LIBRARIES = tuple(filter(None, map(_package_dir, _PASS_THROUGH_PACKAGES)))
        _INTERNAL = (_PACKAGE_DIR + os.sep, stdlib, *_LIBRARIES)
    if filename.startswith(_RUNNERS) or filename == "<frozen runpy>":
        return _RUNNER
    if filename == _DEMO:  # the built-in demo stands for the user's program
        return _USER
    if filename.startswith(_LIBRARIES) and not filename.endswith(_LIBRARY_NOISE):
        return _LIBRARY
    if filename.startswith("<") or filename.startswith(_INTERNAL):
        return _PASS
    return _USER


def _internal(filename: str) -> bool:
    return _classify(filename) != _USER


_phase = threading.local()


@contextlib.contextmanager
def phase(description: str):
    """What the program is doing when no user frame is on the stack (e.g.
    "after the script ended: the garbage collector ran before the
    report"): frees captured inside this block say so."""
    outer = getattr(_phase, "text", None)
    _phase.text = description
    try:
        yield
    finally:
        _phase.text = outer


def _frameless_context(library: tuple) -> str:
    """Why a capture found no user frame, as truthfully as can be told."""
    text = getattr(_phase, "text", None)
    if text:
        where = text
    elif sys.is_finalizing():
        where = "at interpreter exit"
    elif threading.current_thread() is not threading.main_thread():
        where = f"on thread {threading.current_thread().name!r}, which runs no user code (e.g. autograd's engine)"
    else:
        where = "run by the interpreter, not by a line of the program (a destructor or the garbage collector)"
    if library:
        code, line = library[0]
        where += f"; innermost library frame {code.co_name} ({os.path.basename(code.co_filename)}:{line})"
    return where


class Site:
    """The user frames (innermost first) above the point of capture, and the
    innermost library (torch) frames below them."""

    __slots__ = ("frames", "library", "context")

    def __init__(self, frames: tuple, library: tuple = (), context: str = "") -> None:
        self.frames = frames  # ((code, lineno), ...)
        self.library = library  # ((code, lineno), ...): torch's, innermost first
        self.context = context  # with no user frame: why (thread, interpreter exit, ...)

    def user_frames(self) -> list:
        return [(code.co_filename, line, code.co_name) for code, line in self.frames]

    def library_frames(self) -> list:
        return [(code.co_filename, line, code.co_name) for code, line in self.library]

    def innermost(self) -> str:
        frames = self.user_frames()
        if not frames:
            return f"<no user frame: {self.context or 'called from C++'}>"
        filename, line, name = frames[0]
        return f"{filename}:{line} in {name}"

    def format(self, limit: int = 6) -> str:
        return "\n".join(
            f'    File "{filename}", line {line}, in {name}'
            for filename, line, name in reversed(self.user_frames()[:limit])
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
    if isinstance(site, Site):
        return site.frames or site.library
    return site


_kind_of: dict = {}  # code object -> _USER, _PASS or _RUNNER
_MAX_WALK = 128  # frames looked at, at most


def capture(depth: int = 8, skip: int = 1) -> Optional[Site]:
    """The innermost ``depth`` user frames above the caller's ``skip``-th
    frame, up to the code that runs the user's; and the library frames
    between the capture and the first user frame (at most 8)."""
    if depth <= 0:
        return None
    phase_text = getattr(_phase, "text", None)
    if phase_text:  # a runner's own step (its garbage collection): the frames above are not the program's
        return Site((), (), phase_text)
    frame = sys._getframe(skip)
    frames = []
    library = []
    append = frames.append
    kind_of = _kind_of
    walked = 0
    while frame is not None and walked < _MAX_WALK:
        code = frame.f_code
        kind = kind_of.get(code)
        if kind is None:
            kind = kind_of[code] = _classify(code.co_filename)
        if kind == _USER:
            append((code, frame.f_lineno))
            if len(frames) == depth:
                break
        elif kind == _LIBRARY:
            if not frames and len(library) < _LIBRARY_FRAMES:
                library.append((code, frame.f_lineno))
        elif kind == _RUNNER and frames:
            break
        frame = frame.f_back
        walked += 1
    if not frames:
        return Site((), tuple(library), _frameless_context(tuple(library)))
    return Site(tuple(frames), tuple(library))
