"""The pools' ordered block set (allocator_shim/src/block_set.*), alone:
random inserts, erases and replacements checked step by step against a
sorted reference (allocator_shim/tests/block_set_test.cpp)."""
import json
import shutil
import subprocess

import pytest


@pytest.fixture(scope="module")
def block_set_test(tmp_path_factory):
    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    out = tmp_path_factory.mktemp("block_set") / "block_set_test"
    subprocess.run([cxx, "-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", "-fsanitize=address,undefined", "-Iallocator_shim/include",
                    "allocator_shim/tests/block_set_test.cpp", "-o", str(out)],  # BlockSet: inline, in headers
                   check=True)
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_block_set_matches_a_sorted_reference(block_set_test, seed):
    done = subprocess.run([str(block_set_test), "20000", str(seed)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    # both paths of replace ran: the node reused in place, and the fallback
    assert result["in_place"] > 1000 and result["moved"] > 1000, result
