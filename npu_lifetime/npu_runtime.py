"""The command line in a torch_npu environment without CANN (``.venv-npu``
on a CPU machine): torch_npu is installed, so ``import torch`` loads it, and
without CANN's libraries that dies in torch's 46-line "Failed to load the
backend extension" traceback.  Before anything imports torch:

- ``--device npu``: the command re-runs itself over the stand-in CANN
  runtime of a repository checkout (``tests/platforms/npu_standin``, built once), and
  says in one line that this is the stand-in, not NPU hardware; where there
  is no stand-in to build, one line says what is missing (exit 2);
- any other device: torch is told not to load torch_npu (the simulated
  device and CUDA need none of it).
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
import sys
from pathlib import Path
from typing import Optional

# set in the re-run process: it is on the stand-in already (and never re-runs twice)
ON_STANDIN = "NPU_LIFETIME_ON_STANDIN"
STANDIN_BUILD = Path(__file__).resolve().parent.parent / "tests" / "platforms" / "npu_standin" / "build.py"
STANDIN_LINE = ("npu-lifetime: no CANN runtime here: running torch_npu over the stand-in CANN runtime "
                "(tests/platforms/npu_standin, a CPU model for tests), not on NPU hardware")


class StandinUnavailable(Exception):
    """No stand-in can be built here; the message says what is missing."""


def cann_missing() -> bool:
    """torch_npu is installed and CANN's runtime library cannot be loaded."""
    if importlib.util.find_spec("torch_npu") is None:
        return False
    try:
        ctypes.CDLL("libascendcl.so")
    except OSError:
        return True
    return False


def standin_environment() -> dict:
    """The variables a torch_npu process needs to run on the stand-in
    (tests/platforms/npu_standin/build.py builds it once, cached)."""
    if not STANDIN_BUILD.exists():
        raise StandinUnavailable(f"{STANDIN_BUILD} is missing (the stand-in ships with a repository checkout, not "
                                 "a wheel): install CANN, or run from a checkout of npu_lifetime")
    spec = importlib.util.spec_from_file_location("npu_standin_build", STANDIN_BUILD)
    build = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(build)
        return build.environment(sys.executable)
    except Exception as err:  # a compiler missing, a failed compile: what it said, in one line
        detail = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
        raise StandinUnavailable(f"the stand-in CANN runtime could not be built ({type(err).__name__}: "
                                 f"{detail}): it needs a C compiler (cc)") from None


def prepare(command: str, device: Optional[str], argv: Optional[list]) -> Optional[int]:
    """Called before the command imports torch.  Returns an exit status
    when the command must not go on here (2: no stand-in, or ``main`` was
    called with ``argv`` from Python, which cannot be re-run); re-runs the
    command's process over the stand-in for ``--device npu`` (never returns
    then).  ``argv``: None for the command line's own."""
    if os.environ.get(ON_STANDIN) or not cann_missing():
        return None
    if device != "npu":
        os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"  # torch without torch_npu: sim and cuda need none of it
        return None
    where = f"npu-lifetime {command}: --device npu: torch_npu is installed but CANN is not"
    if argv is not None:
        print(f"{where}; run the npu-lifetime command itself, which re-runs over the stand-in CANN runtime",
              file=sys.stderr)
        return 2
    try:
        env = standin_environment()
    except StandinUnavailable as err:
        print(f"{where} ({err})", file=sys.stderr)
        return 2
    print(STANDIN_LINE, file=sys.stderr)
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "npu_lifetime.cli", *sys.argv[1:]],
              dict(os.environ, **env, **{ON_STANDIN: "1"}))
    return None  # not reached
