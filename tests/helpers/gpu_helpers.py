"""Running GPU programs in fresh processes (the allocator can be swapped
only before CUDA allocates), and skipping cleanly without a GPU."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

PROGRAMS = Path(__file__).resolve().parents[1] / "platforms" / "gpu_programs"


def run_program(script: str, *args: str, timeout: float = 300) -> dict:
    """The JSON object that gpu_programs/SCRIPT (or SCRIPT, an absolute path)
    printed last, run with ARGS in a fresh process."""
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    done = subprocess.run(
        [sys.executable, str(PROGRAMS / script), *args],
        capture_output=True, text=True, timeout=timeout, env=env,
    )
    assert done.returncode == 0, f"exit status {done.returncode}\nstdout: {done.stdout[-3000:]}\nstderr: {done.stderr[-4000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])
