"""The torch bridge: built against the torch in use, it raises torch's
out-of-memory error (c10::OutOfMemoryError, which torch's Python layer turns
into torch.OutOfMemoryError) where the shim can only return NULL.  On CPU a
C++ driver plays torch's pluggable allocator; the GPU test
(test_gpu_oom.py) checks the Python exception under torch itself."""
import shutil
import subprocess

import pytest
import torch

from npu_lifetime.shim import bridge, library_path


@pytest.fixture(scope="session")
def built_bridge(tmp_path_factory):
    if shutil.which("c++") is None:
        pytest.skip("no C++ compiler")
    return bridge.build(tmp_path_factory.mktemp("bridge"))


def test_the_bridge_builds_once_per_torch(built_bridge):
    assert built_bridge.exists()
    assert bridge.build(built_bridge.parent) == built_bridge  # cached


def test_out_of_memory_becomes_c10_out_of_memory_error_with_the_shims_figures(built_bridge, tmp_path):
    from pathlib import Path

    torch_dir = Path(torch.__file__).parent
    driver = tmp_path / "bridge_driver"
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    subprocess.run(["c++", "-std=c++17", "-O1", f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-isystem",
                    str(torch_dir / "include"), "allocator_shim/tests/bridge_driver.cpp", "-o", str(driver),
                    f"-L{torch_dir / 'lib'}", "-lc10", f"-Wl,-rpath,{torch_dir / 'lib'}", "-ldl"], check=True)
    done = subprocess.run([str(driver), str(library_path()), str(built_bridge)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "npu_lifetime shim: out of memory on device 0. Tried to allocate 1024.00 MiB" in done.stdout


def test_without_a_compiler_the_bridge_is_unavailable(monkeypatch, tmp_path):
    monkeypatch.setenv("CXX", "no-such-compiler-npu-lifetime")
    with pytest.raises(bridge.BridgeUnavailable, match="no C\\+\\+ compiler"):
        bridge.build(tmp_path)
