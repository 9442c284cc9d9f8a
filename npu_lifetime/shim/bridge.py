"""Builds and loads the bridges (allocator_shim/torch_bridge/), the small
C++ files that need a framework's headers, which the shim itself does
without:

- the torch bridge (``oom_bridge.cpp``): the allocation entry point that
  raises torch's out-of-memory error when the shim is out of memory (a
  pluggable allocator can only return NULL, which torch would hand on as a
  tensor at address 0);
- the NPU bridge (``npu_queue_bridge.cpp``): the shim's events and stream
  waits through torch_npu's task queue (``npu_queue.py``);
- the CUDA bridge (``cuda_allocator_bridge.cpp``): the shim as torch's CUDA
  allocator with the entry points a pluggable allocator lacks (cacheInfo,
  memory history, MemPool, pool checkpoints); it raises torch's
  out-of-memory error itself;
- the GPU trace bridge (``gpu_trace_bridge.cpp``, the sanitizer's): torch's
  GPU trace delivered to its Python registries without torch's import per
  event (``npu_lifetime/sanitizer/trace_bridge.py``).

Each is compiled once per framework build, against the one in use, with the
system C++ compiler, and cached (``$NPU_LIFETIME_CACHE``, else
``~/.cache/npu_lifetime``).  Without a compiler the shim is installed
without the torch bridge, and an allocation that fails returns address 0: a
warning says so.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Optional

from .libnpl import library, symbol_address

TORCH_BRIDGE = "oom_bridge.cpp"
NPU_BRIDGE = "npu_queue_bridge.cpp"
CUDA_BRIDGE = "cuda_allocator_bridge.cpp"
GPU_TRACE_BRIDGE = "gpu_trace_bridge.cpp"


class BridgeUnavailable(RuntimeError):
    pass


def source_path(name: str = TORCH_BRIDGE) -> Path:
    """A bridge's source: shipped beside the built shim, or in the checkout."""
    here = Path(__file__).resolve().parent.parent
    for candidate in (here / "_native" / name, here.parent / "allocator_shim" / "torch_bridge" / name):
        if candidate.exists():
            return candidate
    raise BridgeUnavailable(f"the bridge's source ({name}) is not installed")


def _shim_header() -> Path:
    """The shim's C header (the NPU bridge implements its npl_queue_ops)."""
    here = Path(__file__).resolve().parent.parent
    for candidate in (here / "_native" / "npu_lifetime_shim.h",
                      here.parent / "allocator_shim" / "include" / "npu_lifetime_shim.h"):
        if candidate.exists():
            return candidate
    raise BridgeUnavailable("the shim's header (npu_lifetime_shim.h) is not installed")


def _cache_dir() -> Path:
    return Path(os.environ.get("NPU_LIFETIME_CACHE", Path.home() / ".cache" / "npu_lifetime"))


def _torch_flags() -> list:
    import torch

    torch_dir = Path(torch.__file__).resolve().parent
    abi = int(bool(torch._C._GLIBCXX_USE_CXX11_ABI))
    return [f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-isystem", str(torch_dir / "include"),
            f"-L{torch_dir / 'lib'}", "-lc10", f"-Wl,-rpath,{torch_dir / 'lib'}"]


def _torch_npu_flags() -> list:
    import torch
    import torch_npu

    torch_dir = Path(torch.__file__).resolve().parent
    npu_dir = Path(torch_npu.__file__).resolve().parent
    return [
        "-isystem", str(torch_dir / "include" / "torch" / "csrc" / "api" / "include"),
        "-isystem", str(npu_dir / "include"), "-isystem", str(npu_dir / "include" / "third_party" / "acl" / "inc"),
        f"-I{_shim_header().parent}", f"-L{npu_dir / 'lib'}", "-ltorch_npu", f"-Wl,-rpath,{npu_dir / 'lib'}",
    ]


def _cuda_include() -> Path:
    """The CUDA runtime's headers torch's CUDA headers include."""
    import torch
    from torch.utils import cpp_extension

    roots = [os.environ.get("CUDA_HOME"), cpp_extension.CUDA_HOME]
    candidates = [Path(root) / "include" for root in roots if root]
    site = Path(torch.__file__).resolve().parent.parent / "nvidia"
    candidates += sorted(site.glob("*/include"))
    for candidate in candidates:
        if (candidate / "cuda_runtime_api.h").exists():
            return candidate
    raise BridgeUnavailable("the CUDA bridge needs the CUDA runtime's headers (cuda_runtime_api.h); set CUDA_HOME")


def _torch_cuda_flags() -> list:
    import torch

    torch_dir = Path(torch.__file__).resolve().parent
    if not (torch_dir / "include" / "torch" / "csrc" / "cuda" / "CUDAPluggableAllocator.h").exists():
        raise BridgeUnavailable("this torch has no CUDA headers (CUDAPluggableAllocator.h)")
    return ["-isystem", str(torch_dir / "include" / "torch" / "csrc" / "api" / "include"),
            "-isystem", str(_cuda_include()), f"-I{_shim_header().parent}",
            "-ltorch_cuda", "-lc10_cuda", "-ltorch_cpu", "-ldl"]


def _gpu_trace_flags() -> list:
    """The running interpreter's headers (its symbols come from the process
    at load time) and libtorch_cpu (torch's TLS guard and interpreter)."""
    return ["-isystem", sysconfig.get_paths()["include"], "-ltorch_cpu"]


def _framework_flags(name: str) -> list:
    if name == GPU_TRACE_BRIDGE:
        return _torch_flags() + _gpu_trace_flags()
    if name == NPU_BRIDGE:
        return _torch_flags() + _torch_npu_flags()
    if name == CUDA_BRIDGE:
        return _torch_flags() + _torch_cuda_flags()
    return _torch_flags()


def _framework_version(name: str) -> bytes:
    import torch

    version = torch.__version__ + torch.__file__
    if name == NPU_BRIDGE:
        import torch_npu

        version += torch_npu.__version__ + torch_npu.__file__
    if name in (NPU_BRIDGE, CUDA_BRIDGE):
        version += _shim_header().read_text()
    if name == GPU_TRACE_BRIDGE:  # built against this interpreter's C API
        version += sys.version + sysconfig.get_paths()["include"]
    return version.encode()


def build(out_dir: Optional[Path] = None, name: str = TORCH_BRIDGE) -> Path:
    """The bridge library ``name`` for the torch (and torch_npu) in use,
    built if not cached."""
    source = source_path(name)
    cxx = shlex.split(os.environ.get("CXX", "c++"))
    if shutil.which(cxx[0]) is None:
        raise BridgeUnavailable(f"no C++ compiler ({cxx[0]}) to build the bridge {name}")
    key = hashlib.sha256(source.read_bytes() + _framework_version(name)).hexdigest()[:16]
    out_dir = out_dir or _cache_dir()
    out = out_dir / f"libnpl_{Path(name).stem}-{key}.so"
    if out.exists():
        return out
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    flags = _framework_flags(name)
    command = [*cxx, "-std=c++17", "-O2", "-fPIC", "-shared", "-fvisibility=hidden", "-Wall", "-Wextra", "-Werror",
               str(source), "-o", str(tmp), *flags]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise BridgeUnavailable(f"building the bridge {name} failed:\n{done.stderr[-2000:]}")
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
