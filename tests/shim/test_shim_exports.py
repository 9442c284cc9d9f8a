"""The shim library's dynamic symbol table holds its C entry points only
(allocator_shim/libnpl.map says why: a build that links libstdc++ statically
exported about 2000 of its symbols and crashed on a null call)."""
import shutil
import subprocess
from pathlib import Path

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


# ---- no exception crosses the C ABI ------------------------------------------------------------------------------
SOURCES = [Path(__file__).resolve().parents[2] / "allocator_shim" / "src" / name
           for name in ("exports.cpp", "torch_hooks.cpp")]


def _exported_bodies(source):
    """(name, body) of each NPL_EXPORT function defined in ``source``."""
    import re

    text = source.read_text()
    for match in re.finditer(r"NPL_EXPORT[^;{]*?\b(npl_\w+)\s*\([^;{]*\)\s*(?:noexcept\s*)?\{", text):
        depth, end = 1, match.end()
        while depth:
            depth += {"{": 1, "}": -1}.get(text[end], 0)
            end += 1
        yield match.group(1), text[match.end():end]


def test_every_entry_point_reaches_the_allocator_inside_guarded():
    """An allocator method may throw (std::bad_alloc, and Locked runs the
    deferred merge of the cached pair first): an entry point calls it inside
    guarded / guarded_void, which turn an exception into an internal_error
    finding and the entry point's failure value.  npl_runtime_name did not."""
    bodies = [body for source in SOURCES for body in _exported_bodies(source)]
    assert len(bodies) > 50  # the parser found the entry points
    unguarded = [name for source in SOURCES for name, body in _exported_bodies(source)
                 if "allocator." in body and "guarded" not in body.split("allocator.")[0]]
    assert unguarded == []
