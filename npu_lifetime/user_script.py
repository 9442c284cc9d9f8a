"""Runs a user's script as ``__main__`` the way ``python script.py args``
would (its ``sys.argv``, its directory first on ``sys.path``), for the
commands that run one.  A bad path is refused before anything runs; how the
script ended is one line the command prints beside its exit code, and its
traceback shows the script's frames, not the launcher's."""
from __future__ import annotations

import operator
import os
import runpy
import sys
import traceback
from dataclasses import dataclass
from typing import Callable, Optional


class ScriptPathError(ValueError):
    """The path names no script that can be run."""


def check_path(path: str) -> None:
    if not os.path.exists(path):
        raise ScriptPathError(f"no such script: {path}")
    if os.path.isdir(path):
        raise ScriptPathError(f"{path} is a directory: give the Python script to run")
    if not os.path.isfile(path):
        raise ScriptPathError(f"{path} is not a regular file: give the Python script to run")
    if not os.access(path, os.R_OK):
        raise ScriptPathError(f"cannot read {path} (permission denied)")


@dataclass(frozen=True)
class Ending:
    """How a script ended: ``how`` is "" when it finished, else e.g.
    "raised ValueError: boom", "exited with status 3", "exited: message",
    "called os._exit(0)" (not failed)."""

    failed: bool
    how: str = ""


def run(path: str, args: list, keep: Optional[list] = None,
        on_os_exit: Optional[Callable[[Ending], int]] = None) -> Ending:
    """Runs ``path`` with ``args``; its exceptions and exits never escape.
    ``keep``: a list that receives the script's globals when it finishes, so
    what they hold stays alive until the caller is done (``check`` reports it
    as live, not as freed at exit).  ``on_os_exit``: called when the script
    calls ``os._exit`` (which ends the process at once, past every finally
    and atexit): it reports and returns the process's exit code, and the
    process then ends with it, as the call would have ended it."""
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [path, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    restore = _hook_os_exit(on_os_exit) if on_os_exit is not None else None
    try:
        namespace = runpy.run_path(path, run_name="__main__")
        if keep is not None:
            keep.append(namespace)
        return Ending(False)
    except SystemExit as exit_:
        return _exit_ending(exit_.code)
    except BaseException as err:  # the script's own error, KeyboardInterrupt included
        sys.stderr.write(script_traceback(err, path))
        return Ending(True, f"raised {type(err).__name__}" + (f": {err}" if str(err) else ""))
    finally:
        if restore is not None:
            restore()
        sys.argv = saved_argv
        sys.path[:] = saved_path


def _hook_os_exit(on_os_exit: Callable[[Ending], int]) -> Callable[[], None]:
    """Replaces ``os._exit`` while the script runs (calls through ``os``;
    a name imported before, ``from os import _exit``, is not seen).  A
    forked child (multiprocessing ends its workers with ``os._exit``) exits
    as it would have."""
    real, pid = os._exit, os.getpid()

    def _exit(status):
        if os.getpid() != pid:
            real(status)
        try:
            status = operator.index(status)
        except TypeError:
            real(status)  # raises os._exit's own TypeError
        os._exit = real
        code = status
        try:
            code = on_os_exit(Ending(status != 0, f"exited with status {status} (os._exit)" if status
                                     else "called os._exit(0)"))
        except BaseException as err:  # the report itself failed: say so, end as the script asked
            sys.stderr.write(f"npu-lifetime: could not report before the script's os._exit({status}): {err!r}\n")
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:
                    pass
            real(code)

    os._exit = _exit
    return lambda: setattr(os, "_exit", real)


def _exit_ending(code) -> Ending:
    if code is None or code == 0:
        return Ending(False)
    if isinstance(code, int):
        return Ending(True, f"exited with status {code}")
    message = str(code)
    print(message, file=sys.stderr)  # what python prints for sys.exit("message")
    return Ending(True, f"exited: {message}" if "\n" not in message.strip() else "exited with the message above")


def script_traceback(err: BaseException, path: str) -> str:
    """The traceback from the script's first frame on (all of it when the
    script never ran, e.g. a SyntaxError: then its location)."""
    target = os.path.abspath(path)
    tb = err.__traceback__
    while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) != target:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(err), err, tb))
