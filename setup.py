"""Builds the native allocator shim (allocator_shim/) with the system C++
compiler as part of the package install.  It is a plain shared library,
loaded with ctypes and by the frameworks' pluggable-allocator APIs; it needs
no torch, CUDA or CANN headers."""
import os
import shlex
import shutil
import subprocess
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

SHIM = Path("allocator_shim")
SOURCES = sorted(str(p) for p in (SHIM / "src").glob("*.cpp"))
# built at install() time against the user's torch / torch_npu (npu_lifetime/shim/bridge.py),
# the NPU bridge with the shim's header
BRIDGES = sorted(SHIM.glob("torch_bridge/*.cpp"))
SHIPPED = [*BRIDGES, SHIM / "include" / "npu_lifetime_shim.h"]
HEADERS = sorted(str(p) for p in SHIM.glob("*/*.h"))
FLAGS = ["-std=c++17", "-O2", "-fPIC", "-shared", "-fvisibility=hidden", "-Wall", "-Wextra", "-Werror"]
# NPL_DEBUG_INVARIANTS=1: a debug build that checks the allocator's
# invariants after every entry point (allocator_shim/src/invariants.cpp).
if os.environ.get("NPL_DEBUG_INVARIANTS") == "1":
    FLAGS += ["-DNPL_CHECK_INVARIANTS", "-g"]


class BuildShim(build_ext):
    def build_extension(self, ext):
        out = Path(self.get_ext_fullpath(ext.name))
        out.parent.mkdir(parents=True, exist_ok=True)
        cxx = shlex.split(os.environ.get("CXX", "c++"))
        cmd = [*cxx, *FLAGS, f"-I{SHIM / 'include'}", *ext.sources, "-o", str(out), "-ldl", "-lpthread"]
        print(" ".join(cmd))
        subprocess.check_call(cmd)
        for path in SHIPPED:
            shutil.copy(path, out.parent / path.name)


setup(
    ext_modules=[Extension("npu_lifetime._native.libnpl", sources=SOURCES, depends=[*HEADERS, *map(str, BRIDGES)])],
    cmdclass={"build_ext": BuildShim},
)
