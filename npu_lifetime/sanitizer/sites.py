"""Cheap call sites: a capture keeps the code objects and instruction
offsets of the user's frames only (whether a code object is the user's is
decided once per code object), stops after ``depth`` of them, and works out
line numbers and formats only when a report or a grouping needs them
(reading ``f_lineno`` costs about as much as an op; CSAN extracts a full
StackSummary on every access, a large part of its cost).  Frames of this package, torch, the standard
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
# this package's files that stand for the user's program: the built-in demo and the corpus's cases
_USER_PROGRAMS = (os.path.join(_PACKAGE_DIR, "viz", "demo.py"), os.path.join(_PACKAGE_DIR, "corpus", "cases") + os.sep)
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
    if user_program(filename):
        return _USER
    if filename.startswith(_LIBRARIES) and not filename.endswith(_LIBRARY_NOISE):
        return _LIBRARY
    if filename.startswith("<") or filename.startswith(_INTERNAL):
        return _PASS
    return _USER


def user_program(filename: str) -> bool:
    """One of this package's files that stands for the user's program (the demo, the corpus's cases)."""
    return filename.startswith(_USER_PROGRAMS)


def internal(filename: str) -> bool:
    """Not the program's code (this package, torch, the standard library, a test runner)."""
    return _classify(filename) != _USER


class _Phase(threading.local):
    text: Optional[str] = None  # a class default: a missing attribute would cost an exception per capture


_phase = _Phase()


@contextlib.contextmanager
def phase(description: str):
    """What the program is doing when no user frame is on the stack (e.g.
    "after the script ended: the garbage collector ran before the
    report"): frees captured inside this block say so."""
    outer = _phase.text
    _phase.text = description
    try:
        yield
    finally:
        _phase.text = outer


def _frameless_context(library: tuple) -> str:
    """Why a capture found no user frame, as truthfully as can be told."""
    text = _phase.text
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
    innermost library (torch) frames below them.  Captured as (code,
    instruction offset) pairs; ``frames`` and ``library`` give (code, line)
    pairs, worked out on first use.

    The slots are a subclass's: ``PythonSite``'s below, or those of the C
    walk's base (``native.py`` makes that class)."""

    __slots__ = ()

    @staticmethod
    def _line(code, offset: int) -> Optional[int]:
        """The line of an instruction offset: what ``f_lineno`` reads, in Python."""
        for start, end, line in code.co_lines():
            if start <= offset < end:
                return line
        return None

    @classmethod
    def frameless(cls, library: tuple) -> "Site":
        """The site of a capture that found no user frame (``library``: the
        library frames' (code, instruction offset) pairs)."""
        library_lines = cls._with_lines(library)
        return cls((), library_lines, _frameless_context(library_lines))

    @classmethod
    def _with_lines(cls, pairs: tuple) -> tuple:
        """(code, instruction offset) pairs as (code, line) pairs."""
        return tuple((code, cls._line(code, offset)) for code, offset in pairs)

    def __init__(self, frames: tuple, library: tuple = (), context: str = "", offsets: bool = False) -> None:
        # offsets: the pairs hold instruction offsets (a capture); else line numbers
        self.raw_frames = frames if offsets else None
        self.raw_library = library if offsets else None
        self._frames = None if offsets else frames
        self._library = None if offsets else library
        self.context = context  # with no user frame: why (thread, interpreter exit, ...)

    @property
    def frames(self) -> tuple:
        """((code, lineno), ...), innermost first."""
        if self._frames is None:
            self._frames = self._with_lines(self.raw_frames)
        return self._frames

    @property
    def library(self) -> tuple:
        """((code, lineno), ...): torch's, innermost first."""
        if self._library is None:
            self._library = self._with_lines(self.raw_library)
        return self._library

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


class PythonSite(Site):
    """A site made by the Python walk (``capture``)."""

    __slots__ = ("raw_frames", "raw_library", "context", "_frames", "_library")


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


# the Python walk's: id(code) -> (_USER, _PASS, _RUNNER or _LIBRARY, code): code objects hash slowly
# (the native walk keeps a code object's kind on the code object)
_kind_of: dict = {}
_MAX_WALK = 128  # frames looked at, at most


def capture(depth: int = 8, skip: int = 0) -> Optional[Site]:
    """The innermost ``depth`` user frames above the ``skip``-th frame above
    the caller's (0: the caller's own), up to the code that runs the user's;
    and the library frames between the capture and the first user frame (at
    most 8).  The Python walk; C's (``native.py``) takes the same arguments."""
    if depth <= 0:
        return None
    phase_text = _phase.text
    if phase_text:  # a runner's own step (its garbage collection): the frames above are not the program's
        return PythonSite((), (), phase_text)
    frames, library = _walk(sys._getframe(skip + 1), depth)
    if not frames:
        return PythonSite.frameless(library)
    return PythonSite(frames, library, offsets=True)


def _walk(frame, depth: int) -> tuple:
    """capture's walk in Python: (user frames, library frames) as (code,
    instruction offset) pairs, innermost first."""
    frames: list = []
    library: list = []
    kind_of = _kind_of
    walked = 0
    while frame is not None and walked < _MAX_WALK:
        code = frame.f_code
        entry = kind_of.get(id(code))
        if entry is None:
            entry = kind_of[id(code)] = (_classify(code.co_filename), code)
        kind = entry[0]
        if kind == _USER:
            frames.append((code, frame.f_lasti))
            if len(frames) == depth:
                break
        elif kind == _LIBRARY:
            if not frames and len(library) < _LIBRARY_FRAMES:
                library.append((code, frame.f_lasti))
        elif kind == _RUNNER and frames:
            break
        frame = frame.f_back
        walked += 1
    return tuple(frames), tuple(library)
