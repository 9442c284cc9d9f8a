"""Running programs under the real torch_npu on the stand-in CANN runtime
(tests/platforms/npu_standin), each in a fresh process of the torch_npu interpreter.

The torch_npu interpreter is NPU_LIFETIME_NPU_PYTHON, else <repo>/.venv-npu/
bin/python when it exists. Without one the NPU tests skip, except under
CI=true, where they fail: CI must build that environment."""
import functools
import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PROGRAMS = REPO / "tests" / "platforms" / "npu_programs"
STANDIN = REPO / "tests" / "platforms" / "npu_standin"


def npu_python():
    """The torch_npu interpreter's path, or None."""
    explicit = os.environ.get("NPU_LIFETIME_NPU_PYTHON")
    if explicit:
        return explicit
    default = REPO / ".venv-npu" / "bin" / "python"
    return str(default) if default.exists() else None


def require_npu_python() -> str:
    """The torch_npu interpreter; skips the test without one (fails under CI)."""
    python = npu_python()
    if python and Path(python).exists():
        return python
    reason = ("no torch_npu interpreter: set NPU_LIFETIME_NPU_PYTHON or create .venv-npu "
              "(torch==2.13.0 CPU build and torch_npu==2.13.0)")
    if os.environ.get("CI") == "true":
        pytest.fail(reason + " [CI=true: the NPU tests must run]")
    pytest.skip(reason)


@functools.lru_cache(maxsize=None)
def standin_environment(python: str) -> dict:
    """The variables a torch_npu process needs (the stand-in is built once)."""
    spec = importlib.util.spec_from_file_location("npu_standin_build", STANDIN / "build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    return build.environment(python, base={})


# NPU_LIFETIME_NPU_RUNTIME=cann: on a machine with an NPU and CANN installed,
# the torch_npu interpreter uses them as they are (no stand-in is built), and
# the tests that drive the stand-in's controls skip.
ON_STANDIN = os.environ.get("NPU_LIFETIME_NPU_RUNTIME", "standin") != "cann"
requires_standin = pytest.mark.skipif(not ON_STANDIN, reason="drives the stand-in CANN runtime's test controls")


def npu_environment(env=None) -> dict:
    """os.environ with the stand-in's variables, PYTHONPATH at the repository
    and TASK_QUEUE_ENABLE unset unless ENV sets it (torch_npu's default)."""
    python = require_npu_python()
    merged = {k: v for k, v in os.environ.items() if k != "TASK_QUEUE_ENABLE" and not k.startswith("NPU_STANDIN_")}
    if ON_STANDIN:
        standin = standin_environment(python)
        paths = [standin["LD_LIBRARY_PATH"], os.environ.get("LD_LIBRARY_PATH", "")]
        merged.update(standin, LD_LIBRARY_PATH=":".join(p for p in paths if p))
    merged["PYTHONPATH"] = ":".join(p for p in (str(REPO), str(PROGRAMS), os.environ.get("PYTHONPATH", "")) if p)
    merged.update(env or {})
    return merged


def run_npu_program(name: str, *args: str, env=None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run tests/platforms/npu_programs/NAME (or NAME, an absolute path) with
    ARGS in the torch_npu interpreter on the stand-in runtime; ENV adds or
    overrides variables."""
    python = require_npu_python()
    return subprocess.run([python, str(PROGRAMS / name), *args], capture_output=True, text=True,
                          timeout=timeout, env=npu_environment(env), cwd=str(REPO))


def program_result(done: subprocess.CompletedProcess) -> dict:
    """The JSON object a program printed last, after checking it succeeded."""
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def task_queue_env(level):
    """ENV for torch_npu's task queue LEVEL (None: unset, its default)."""
    return {} if level is None else {"TASK_QUEUE_ENABLE": str(level)}


TASK_QUEUE_LEVELS = [None, "0", "1", "2"]
