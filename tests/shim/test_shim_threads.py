"""The shim under threads, at exit and across fork(): hooks set and cleared
while 8 threads allocate (allocator_shim/tests/hook_stress.c, with the
allocator's invariant checker run after every step, and in a debug build
after every entry point of every thread), a process that exits with the
sanitizer's hooks set and blocks still live, and a forked child allocating
while its parent's threads held the shim's locks."""
import json
import os
import shutil
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import compile_c
from npu_lifetime.shim import library_path


@pytest.fixture(scope="session")
def hook_stress(tmp_path_factory):
    return compile_c(tmp_path_factory, "hook_stress.c", "hook_stress", "-O2", "-pthread", "-ldl")


@pytest.fixture(scope="session")
def debug_shim(tmp_path_factory):
    """The shim built as NPL_DEBUG_INVARIANTS=1 builds it (-DNPL_CHECK_INVARIANTS),
    at -O1 to build faster: every entry point checks the invariants.  With the
    futex lock (-DNPL_FUTEX_LOCK, a build option until its FSDP2 A/B): the
    8-thread stress then checks that lock's exclusion, the installed build
    std::mutex's."""
    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    out = tmp_path_factory.mktemp("debug_shim")
    sources = sorted(Path("allocator_shim/src").glob("*.cpp"))
    flags = ["-std=c++17", "-O1", "-fPIC", "-fvisibility=hidden", "-Wall", "-Wextra", "-Werror",
             "-DNPL_CHECK_INVARIANTS", "-DNPL_FUTEX_LOCK", "-Iallocator_shim/include"]

    def compile_one(src):
        subprocess.run([cxx, *flags, "-c", str(src), "-o", str(out / f"{src.stem}.o")], check=True)

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        list(pool.map(compile_one, sources))
    library = out / "libnpl_debug.so"
    subprocess.run([cxx, "-shared", "-Wl,--version-script=allocator_shim/libnpl.map",
                    *[str(out / f"{src.stem}.o") for src in sources], "-o", str(library), "-ldl",
                    "-lpthread"], check=True)
    return library


def _hook_stress(binary, library, iterations):
    done = subprocess.run([str(binary), str(library), str(iterations)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def test_hooks_replaced_while_8_threads_allocate_never_run_stale(hook_stress):
    result = _hook_stress(hook_stress, library_path(), 20000)
    assert result["faults"] == 0 and result["hook_calls"] > 0
    assert result["invariant_violations"] == 0  # checked after every iteration, under the threads' traffic


def test_a_debug_build_checks_the_invariants_after_every_entry_point(hook_stress, debug_shim):
    result = _hook_stress(hook_stress, debug_shim, 300)
    assert result["faults"] == 0 and result["hook_calls"] > 0 and result["invariant_violations"] == 0
    check = subprocess.run([sys.executable, "-c", "import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); "
                            "print(lib.npl_invariant_checks_built_in(), ctypes.CDLL(sys.argv[2])"
                            ".npl_invariant_checks_built_in())", str(debug_shim), str(library_path())],
                           capture_output=True, text=True, check=True)
    assert check.stdout.split() == ["1", "0"]  # the debug build checks; the installed one does not


def _run_python(code: str, timeout: float = 60, env=None):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, **(env or {})))


@pytest.fixture(scope="session")
def exit_free_library(tmp_path_factory):
    return compile_c(tmp_path_factory, "exit_free.c", "libexitfree.so", "-shared", "-fPIC")


def test_a_free_after_interpreter_exit_with_hooks_set_is_clean(exit_free_library):
    # Before the hooks were cleared at exit this died with SIGSEGV: the
    # free called the sanitizer's Python hook in a finalised interpreter.
    done = _run_python(f"""
        import ctypes
        from npu_lifetime import shim
        from npu_lifetime.shim import hooks
        from npu_lifetime.shim.libnpl import symbol_address
        shim.select_runtime("sim")
        seen = []
        hooks.subscribe(lambda *a: seen.append(a), lambda *a: seen.append(a))
        lib = ctypes.CDLL({str(exit_free_library)!r})
        lib.free_at_exit.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        lib.free_at_exit(symbol_address("npl_free"), shim.alloc(4096, 0, 0x10))
        assert len(seen) == 1
    """)
    assert done.returncode == 0, done.stderr[-3000:]


def test_a_forked_child_can_allocate_while_parent_threads_were_inside_the_shim():
    done = _run_python("""
        import os, threading
        from npu_lifetime import shim
        shim.select_runtime("sim")
        stop = False

        def churn(stream):
            while not stop:
                p = shim.alloc(4096, 0, stream)
                shim.record_use(p, stream + 1)
                shim.free(p, 4096, 0, stream)

        threads = [threading.Thread(target=churn, args=(0x100 * (i + 1),)) for i in range(8)]
        for t in threads:
            t.start()
        children = []
        for _ in range(10):
            pid = os.fork()
            if pid == 0:
                p = shim.alloc(1 << 20, 0, 0x77)
                shim.free(p, 1 << 20, 0, 0x77)
                os._exit(0 if p else 3)
            children.append(pid)
        codes = [os.waitpid(pid, 0)[1] for pid in children]
        stop = True
        for t in threads:
            t.join()
        assert codes == [0] * 10, codes
    """, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
