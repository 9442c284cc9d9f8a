"""User scripts the command-line tests run, written to a file: the simulated
device's forgotten hand-off (the README's first example, the bug most
tests check for) and the writer every such test shares; and user test
files, run by pytest with the plugin."""
import os
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_FORGOTTEN_HANDOFF = textwrap.dedent("""
    import torch
    import npu_lifetime
    from npu_lifetime import simdevice as sd

    side = sd.Stream()
    {tensor} = torch.ones({size})
    side.wait_stream(sd.default_stream())
    with sd.stream(side):
        {result} = {tensor} * 2
    {fix}
    del {tensor}
    """)


def forgotten_handoff(fix: str = "", tensor: str = "x", result: str = "y", size: int = 32) -> str:
    """A program whose side stream reads TENSOR that the default stream then
    frees with no hand-off; FIX (a line, e.g. a record_use) goes before the free."""
    return _FORGOTTEN_HANDOFF.format(fix=fix, tensor=tensor, result=result, size=size)


_MISSING_HANDOFF_ON = textwrap.dedent("""
    \"\"\"A script for `npu-lifetime check --device {device}`: x is read on a side stream and dropped with
    no hand-off (an uncovered free).\"\"\"
    import torch
    side = torch.{device}.Stream()
    x = torch.ones(1024, device="{device}")
    side.wait_stream(torch.{device}.current_stream())
    with torch.{device}.stream(side):
        y = x * 2
    del x
    torch.{device}.synchronize()
    print("done", float(y.sum()))
    """).lstrip()


def missing_handoff_on(device: str, directory: Path) -> Path:
    """The forgotten hand-off on a real DEVICE (cuda, npu) as
    DIRECTORY/script_missing_handoff.py, the name its reports' sites show."""
    return Path(write_script(directory, _MISSING_HANDOFF_ON.format(device=device), "script_missing_handoff.py"))


def write_script(directory: Path, body: str, name: str = "prog.py") -> str:
    """BODY, dedented, as DIRECTORY/NAME; its path as a string."""
    path = Path(directory) / name
    path.write_text(textwrap.dedent(body))
    return str(path)

# an actual reuse race on the simulated device: freed while side may still read, the memory handed out again
REUSED = """
import ctypes
import torch
from npu_lifetime import simdevice as sd
from npu_lifetime.recording import watchers

pool = (ctypes.c_float * 1024)()


def from_pool(n):  # a toy allocator that always hands out the same memory
    t = torch.frombuffer(pool, dtype=torch.float32, count=n)
    watchers.track_allocation(t, sd.current_stream())
    return t


side = sd.Stream()
x = from_pool(1024)
x.fill_(1.0)
address = x.data_ptr()
side.wait_stream(sd.default_stream())
with sd.stream(side):
    y = x.sum()
del x  # uncovered: the read on side may still be queued
z = from_pool(512)  # a new owner of half that memory, on the default stream
z.fill_(7.0)  # not ordered after the read on side: the corruption itself
print("reused", z.data_ptr() == address)
"""


# A user test file's hand-off (it imports gc, torch, npu_lifetime and simdevice as sd):
# x read on a side stream, then freed, with the record_use only if FIX.
USER_HANDOFF = textwrap.dedent("""
    def handoff(fix):
        side = sd.Stream()
        x = torch.ones(32)
        side.wait_stream(sd.default_stream())
        with sd.stream(side):
            x.sum()
        if fix:
            npu_lifetime.record_use(x, side)
        del x
        gc.collect()
    """)


def run_user_tests(directory: Path, body: str, *options: str, env=None) -> subprocess.CompletedProcess:
    """BODY, dedented, as DIRECTORY/test_user.py, run there by pytest -q with
    OPTIONS in a fresh process that loads the plugin; ENV adds variables."""
    (Path(directory) / "test_user.py").write_text(textwrap.dedent(body))
    load = [] if plugin_registered() else ["-p", "npu_lifetime.pytest_plugin"]  # from a bare checkout
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *load, *options, "test_user.py"],
        capture_output=True, text=True, cwd=directory, timeout=600,
        env=dict(os.environ, PYTHONWARNINGS="ignore", PYTHONPATH=str(ROOT), **(env or {})))


def plugin_registered() -> bool:
    """Whether the pytest plugin loads by its entry point (installed); from a
    bare checkout a run needs ``-p npu_lifetime.pytest_plugin``."""
    return any(ep.value == "npu_lifetime.pytest_plugin" for ep in entry_points(group="pytest11"))
