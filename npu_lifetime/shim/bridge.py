"""Builds and loads the torch bridge (allocator_shim/torch_bridge/): the
allocation entry point that raises torch's out-of-memory error when the shim
is out of memory (a pluggable allocator can only return NULL, which torch
would hand on as a tensor at address 0).

It is compiled once per torch build, against the torch in use, with the
system C++ compiler, and cached (``$NPU_LIFETIME_CACHE``, else
``~/.cache/npu_lifetime``).  Without a compiler the shim is installed
without it, and an allocation that fails returns address 0: a warning says so.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Optional

from .native import library, symbol_address

_SOURCE_NAME = "oom_bridge.cpp"


class BridgeUnavailable(RuntimeError):
    pass


def source_path() -> Path:
    """The bridge's source: shipped beside the built shim, or in the checkout."""
    here = Path(__file__).resolve().parent.parent
    for candidate in (here / "_native" / _SOURCE_NAME, here.parent / "allocator_shim" / "torch_bridge" / _SOURCE_NAME):
        if candidate.exists():
            return candidate
    raise BridgeUnavailable(f"the torch bridge's source ({_SOURCE_NAME}) is not installed")


def _cache_dir() -> Path:
    return Path(os.environ.get("NPU_LIFETIME_CACHE", Path.home() / ".cache" / "npu_lifetime"))


def _compile_command(source: Path, out: Path) -> list:
    import torch

    torch_dir = Path(torch.__file__).resolve().parent
    abi = int(bool(torch._C._GLIBCXX_USE_CXX11_ABI))
    cxx = shlex.split(os.environ.get("CXX", "c++"))
    return [
        *cxx, "-std=c++17", "-O2", "-fPIC", "-shared", "-fvisibility=hidden", "-Wall", "-Wextra", "-Werror",
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-isystem", str(torch_dir / "include"), str(source), "-o", str(out),
        f"-L{torch_dir / 'lib'}", "-lc10", f"-Wl,-rpath,{torch_dir / 'lib'}",
    ]


def build(out_dir: Optional[Path] = None) -> Path:
    """The bridge library for the torch in use, built if not cached."""
    import torch

    source = source_path()
    cxx = shlex.split(os.environ.get("CXX", "c++"))[0]
    if shutil.which(cxx) is None:
        raise BridgeUnavailable(f"no C++ compiler ({cxx}) to build the torch bridge")
    key = hashlib.sha256(source.read_bytes() + torch.__version__.encode() + torch.__file__.encode()).hexdigest()[:16]
    out_dir = out_dir or _cache_dir()
    out = out_dir / f"libnpl_torch_bridge-{key}.so"
    if out.exists():
        return out
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    done = subprocess.run(_compile_command(source, tmp), capture_output=True, text=True)
    if done.returncode != 0:
        raise BridgeUnavailable(f"building the torch bridge failed:\n{done.stderr[-2000:]}")
    os.replace(tmp, out)  # atomic: concurrent installs never see a half-written library
    return out


def connect(path: Path) -> ctypes.CDLL:
    """Loads the bridge and points it at the shim."""
    try:
        bridge = ctypes.CDLL(str(path))
    except OSError as err:  # e.g. a symbol this torch build does not export
        raise BridgeUnavailable(f"cannot load the torch bridge {path}: {err}") from err
    bridge.npl_bridge_connect.argtypes = [ctypes.c_void_p] * 3
    library()  # the shim is loaded (and its ABI checked) first
    bridge.npl_bridge_connect(
        symbol_address("npl_alloc"), symbol_address("npl_free"), symbol_address("npl_last_oom_message")
    )
    return bridge
