"""Test-only entry points of the shim, bound here with ctypes: the invariant
checker and the simulated runtime's call counts, injected failures and
stream progress (allocator_shim/include/npu_lifetime_shim.h); and how many
blocks wait once a simulated stream ran."""
import ctypes
import json

from npu_lifetime.shim.libnpl import library, take_string

_bound = False


def _lib():
    global _bound
    lib = library()
    if not _bound:
        lib.npl_check_invariants.restype, lib.npl_check_invariants.argtypes = ctypes.c_void_p, []
        lib.npl_invariant_checks_built_in.restype, lib.npl_invariant_checks_built_in.argtypes = ctypes.c_int, []
        lib.npl_sim_fail_next.restype = ctypes.c_int
        lib.npl_sim_fail_next.argtypes = [ctypes.c_char_p, ctypes.c_uint64]
        lib.npl_sim_calls.restype, lib.npl_sim_calls.argtypes = ctypes.c_uint64, [ctypes.c_char_p]
        lib.npl_sim_completed.restype, lib.npl_sim_completed.argtypes = ctypes.c_uint64, [ctypes.c_void_p]
        _bound = True
    return lib


def invariant_violations() -> list:
    """The allocator's invariants that do not hold now (sentences)."""
    return json.loads(take_string(_lib().npl_check_invariants()))


def check_invariants() -> None:
    bad = invariant_violations()
    assert bad == [], "allocator invariants broken:\n  " + "\n  ".join(bad)


def pending_once_done(shim, stream: int) -> int:
    """The blocks the shim still holds back once the simulated runtime ran
    all of STREAM's queued work and the shim processed its events."""
    shim.sim.complete(stream)
    shim.process_events()
    return shim.stats()["pending.all.current"]


def sim_fail_next(call: str, n: int = 1) -> None:
    """The next ``n`` calls of the simulated runtime's ``call`` fail."""
    assert _lib().npl_sim_fail_next(call.encode(), n) == 0, call


def sim_calls(call: str) -> int:
    return _lib().npl_sim_calls(call.encode())


def sim_completed(stream: int) -> int:
    """Operations of ``stream`` that have run."""
    return _lib().npl_sim_completed(stream)


def build_shim(out, *defines: str):
    """The shim's sources built into ``out`` (a Path) with ``defines``, -O0 (quick to
    compile): a mutant whose deliberately broken rule a test must catch,
    loaded in a subprocess through NPU_LIFETIME_SHIM."""
    import os
    import subprocess
    from concurrent.futures import ThreadPoolExecutor
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    sources = sorted((repo / "allocator_shim" / "src").glob("*.cpp"))
    flags = ["-std=c++17", "-O0", "-fPIC", "-fvisibility=hidden", f"-I{repo / 'allocator_shim' / 'include'}",
             *defines]
    objects = [out / (src.stem + ".o") for src in sources]
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        runs = pool.map(lambda pair: subprocess.run(["c++", *flags, "-c", str(pair[0]), "-o", str(pair[1])],
                                                    capture_output=True, text=True), zip(sources, objects))
        for done in runs:
            assert done.returncode == 0, done.stderr
    library = out / "libnpl_mutant.so"
    subprocess.run(["c++", "-shared", "-fPIC", f"-Wl,--version-script={repo / 'allocator_shim' / 'libnpl.map'}",
                    *map(str, objects), "-o", str(library), "-ldl", "-lpthread"], check=True)
    return library
