"""Builds the native allocator shim (allocator_shim/) with the system C++
compiler as part of the package install.  It is a plain shared library,
loaded with ctypes and by the frameworks' pluggable-allocator APIs; it needs
no torch, CUDA or CANN headers."""
import os
import shlex
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

SHIM = Path("allocator_shim")
SOURCES = sorted(str(p) for p in (SHIM / "src").glob("*.cpp"))
# built at install() time against the user's torch / torch_npu (npu_lifetime/shim/bridge.py),
# the NPU bridge with the shim's header
BRIDGES = sorted(SHIM.glob("torch_bridge/*.cpp"))
SHIPPED = [*BRIDGES, SHIM / "include" / "npu_lifetime_shim.h"]
HEADERS = sorted(str(p) for p in SHIM.glob("*/*.h"))
# the library exports its npl_* entry points only (why: allocator_shim/libnpl.map)
EXPORTS = SHIM / "libnpl.map"
LINK_FLAGS = ["-shared", "-fPIC", f"-Wl,--version-script={EXPORTS}"]
FLAGS = ["-std=c++17", "-O2", "-fPIC", "-fvisibility=hidden", "-Wall", "-Wextra", "-Werror"]
# NPL_DEBUG_INVARIANTS=1: a debug build that checks the allocator's
# invariants after every entry point (allocator_shim/src/invariants.cpp).
if os.environ.get("NPL_DEBUG_INVARIANTS") == "1":
    FLAGS += ["-DNPL_CHECK_INVARIANTS", "-g"]
# NPL_FUTEX_LOCK=1: the allocator's lock is allocator_lock.h's futex mutex
# instead of std::mutex (pending its FSDP2 A/B: design/allocator-shim.md).
if os.environ.get("NPL_FUTEX_LOCK") == "1":
    FLAGS += ["-DNPL_FUTEX_LOCK"]


# Python extensions the package works without (each has a pure-Python
# equivalent): a failed build (no Python headers, no compiler) is a warning.
OPTIONAL_EXTENSIONS = [
    # the sanitizer's stack walk (npu_lifetime/sanitizer/sites.py)
    Extension("npu_lifetime.sanitizer._frames", sources=["npu_lifetime/sanitizer/_c/_frames.c"],
              extra_compile_args=["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror"]),
    # the sanitizer's scan of an op's tensor arguments (npu_lifetime/sanitizer/accesses.py)
    Extension("npu_lifetime.sanitizer._scan", sources=["npu_lifetime/sanitizer/_c/_scan.c"],
              depends=["npu_lifetime/sanitizer/_c/access_object.h"],
              extra_compile_args=["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror"]),
    # the sanitizer's feed of an op's accesses into the model (npu_lifetime/sanitizer/sanitizer.py)
    Extension("npu_lifetime.sanitizer._op_feed", sources=["npu_lifetime/sanitizer/_c/_op_feed.c"],
              depends=["npu_lifetime/sanitizer/_c/access_object.h"],
              extra_compile_args=["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror"]),
    Extension("npu_lifetime.sanitizer._dispatch", sources=["npu_lifetime/sanitizer/_c/_dispatch.c"],
              depends=["npu_lifetime/sanitizer/_c/access_object.h"],
              extra_compile_args=["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror"]),
    # the sanitizer's allocations and frees into its storage table and model (npu_lifetime/sanitizer/storages.py)
    Extension("npu_lifetime.sanitizer._storage_feed", sources=["npu_lifetime/sanitizer/_c/_storage_feed.c"],
              depends=["npu_lifetime/sanitizer/_c/host_entry.h"],
              extra_compile_args=["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror"]),
    # the device allocation trace's delivery to the sanitizers (npu_lifetime/sanitizer/backends.py)
    Extension("npu_lifetime.sanitizer._trace_hook", sources=["npu_lifetime/sanitizer/_c/_trace_hook.c"],
              extra_compile_args=["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror"]),
    # device events' delivery to the sanitizers, or to the op in progress (npu_lifetime/sanitizer/hub.py)
    Extension("npu_lifetime.sanitizer._event_hook", sources=["npu_lifetime/sanitizer/_c/_event_hook.c"],
              extra_compile_args=["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror"]),
    # the sanitizer's device-event handlers, into its model (npu_lifetime/sanitizer/sanitizer.py)
    Extension("npu_lifetime.sanitizer._event_feed", sources=["npu_lifetime/sanitizer/_c/_event_feed.c"],
              depends=["npu_lifetime/sanitizer/_c/host_entry.h"],
              extra_compile_args=["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror"]),
    # threads already running when a sanitizer is enabled take its dispatch mode (npu_lifetime/sanitizer/threads.py)
    Extension("npu_lifetime.sanitizer._threads", sources=["npu_lifetime/sanitizer/_c/_threads.c"],
              extra_compile_args=["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror"]),
    # the sanitizer's lock, entered a few times per op (npu_lifetime/sanitizer/feeds.py, HostLock)
    Extension("npu_lifetime.sanitizer._host_lock", sources=["npu_lifetime/sanitizer/_c/_host_lock.c"],
              extra_compile_args=["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror"]),
    # the shim's allocation and free hooks, relayed to their Python subscribers (npu_lifetime/shim/hooks.py)
    Extension("npu_lifetime.shim._hook_relay", sources=["npu_lifetime/shim/_hook_relay.c"],
              extra_compile_args=["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror"]),
    # the torch-allocator fallback's table of held storages (npu_lifetime/recording/torch_allocator_fallback.py)
    Extension("npu_lifetime.recording._holds", sources=["npu_lifetime/recording/_holds.cpp"],
              depends=["npu_lifetime/recording/cuda_runtime.h"], libraries=["dl"],
              language="c++",
              extra_compile_args=["-std=c++17", "-O2", "-fvisibility=hidden", "-Wall", "-Wextra", "-Werror"]),
    # record_use's Python entry for the shim's route (npu_lifetime/recording/calls.py keeps the reference)
    Extension("npu_lifetime.recording._entry", sources=["npu_lifetime/recording/_entry.c"],
              extra_compile_args=["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror"]),
    # the lifetime model in C++ (npu_lifetime/lifetime/model.py stays the reference)
    Extension("npu_lifetime.lifetime._native_model", sources=["npu_lifetime/lifetime/native_model.cpp"],
              language="c++",
              extra_compile_args=["-std=c++17", "-O2", "-fvisibility=hidden", "-Wall", "-Wextra", "-Werror"]),
]
# every C part keeps the seam's rules (npu_lifetime/seam.h)
for _extension in OPTIONAL_EXTENSIONS:
    _extension.depends.append("npu_lifetime/seam.h")


class BuildShim(build_ext):
    def build_extension(self, ext):
        if ext in OPTIONAL_EXTENSIONS:
            try:
                super().build_extension(ext)
            except Exception as error:  # noqa: BLE001 - any failure leaves the pure-Python path
                print(f"warning: {ext.name} not built ({error}); the pure-Python equivalent is used")
                self._not_built = [*getattr(self, "_not_built", []), ext]
            return
        self._build_shim(ext)

    def build_extensions(self):
        super().build_extensions()
        # an optional extension that failed has no file to copy (--inplace, pip install -e) or install
        self.extensions = [ext for ext in self.extensions if ext not in getattr(self, "_not_built", [])]

    def _build_shim(self, ext):
        """Each source compiled on its own core (the install's longest step:
        about 30 s of CPU), then linked."""
        out = Path(self.get_ext_fullpath(ext.name))
        out.parent.mkdir(parents=True, exist_ok=True)
        objects_dir = Path(self.build_temp) / "shim"
        objects_dir.mkdir(parents=True, exist_ok=True)
        cxx = shlex.split(os.environ.get("CXX", "c++"))
        objects = [str(objects_dir / (Path(source).stem + ".o")) for source in ext.sources]
        compiles = [[*cxx, *FLAGS, f"-I{SHIM / 'include'}", "-c", source, "-o", obj]
                    for source, obj in zip(ext.sources, objects)]
        print(" ".join(compiles[0][:-4]) + f" -c <each of {len(compiles)} sources>")
        with ThreadPoolExecutor(max_workers=max(1, min(len(compiles), os.cpu_count() or 1))) as pool:
            for done in pool.map(lambda cmd: subprocess.run(cmd, capture_output=True, text=True), compiles):
                if done.returncode:
                    raise RuntimeError(f"{' '.join(done.args)} failed:\n{done.stdout}{done.stderr}")
        link = [*cxx, *LINK_FLAGS, *objects, "-o", str(out), "-ldl", "-lpthread"]
        print(" ".join(link))
        subprocess.check_call(link)
        for path in SHIPPED:
            shutil.copy(path, out.parent / path.name)


# NPU_LIFETIME_SANITIZER's start-up hook, as coverage.py's process start-up: a .pth file at the top of
# site-packages, run by every interpreter at start-up; it imports npu_lifetime only when the variable is set
STARTUP_HOOK = "npu_lifetime/startup_hook.pth"
STARTUP_HOOK_NAME = "npu_lifetime_sanitizer.pth"


class BuildPyWithStartupHook(build_py):
    def run(self):
        super().run()
        self.copy_file(STARTUP_HOOK, os.path.join(self.build_lib, STARTUP_HOOK_NAME))

    def get_outputs(self, include_bytecode=1):
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, STARTUP_HOOK_NAME)]

    def get_output_mapping(self):
        return {**super().get_output_mapping(), os.path.join(self.build_lib, STARTUP_HOOK_NAME): STARTUP_HOOK}


setup(
    ext_modules=[Extension("npu_lifetime._native.libnpl", sources=SOURCES, depends=[*HEADERS, *map(str, BRIDGES), str(EXPORTS)]),
                 *OPTIONAL_EXTENSIONS],
    cmdclass={"build_ext": BuildShim, "build_py": BuildPyWithStartupHook},
)
