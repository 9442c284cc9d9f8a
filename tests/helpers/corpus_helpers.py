"""Running the corpus of real programs (examples/) under the sanitizer, on
the simulated device here and on CUDA / NCCL on the GPU machine."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SINGLE = ("prefetch_loader", "offload_activations", "compiled_side_stream")
DISTRIBUTED = ("ddp_sanitized", "fsdp2_sanitized")


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore", NCCL_NVLS_ENABLE="0")


def _keep(name: str, done: subprocess.CompletedProcess) -> None:
    """The child's output under $NPU_LIFETIME_TEST_LOGS where it is set (the
    GPU scripts set it): a run killed at its time limit loses pytest's report."""
    folder = os.environ.get("NPU_LIFETIME_TEST_LOGS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        for stream in ("stdout", "stderr"):
            (Path(folder) / f"{name}.{stream}").write_text(getattr(done, stream) or "")


def run_single(name: str, device: str, *args: str, timeout: float = 900) -> dict:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / f"{name}.py"), "--device", device, *args],
        capture_output=True, text=True, env=_env(), timeout=timeout, cwd=ROOT,
    )
    _keep(f"{name}_{device}", done)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_distributed(name: str, device: str, out_dir: Path, *args: str, timeout: float = 900) -> list:
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={_free_port()}",
         str(ROOT / "examples" / f"{name}.py"), "--device", device, "--json", str(out_dir), *args],
        capture_output=True, text=True, env=_env(), timeout=timeout, cwd=ROOT,
    )
    _keep(f"{name}_{device}_distributed", done)
    assert done.returncode == 0, done.stderr[-4000:]
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in (0, 1)]
