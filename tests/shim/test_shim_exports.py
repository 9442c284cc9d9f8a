"""The shim library's dynamic symbol table holds its C entry points only
(allocator_shim/libnpl.map says why: a build that links libstdc++ statically
exported about 2000 of its symbols and crashed on a null call)."""
import shutil
import subprocess

import pytest

from npu_lifetime.shim.libnpl import library_path


def _exported(library):
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("no nm (binutils)")
    listing = subprocess.run([nm, "-D", "--defined-only", str(library)], capture_output=True, text=True, check=True)
    return [line.split()[-1] for line in listing.stdout.splitlines() if line.strip()]


def test_the_library_exports_npl_entry_points_only():
    exported = _exported(library_path())
    assert "npl_alloc" in exported and "npl_free" in exported
    assert [name for name in exported if not name.startswith("npl_")] == []
