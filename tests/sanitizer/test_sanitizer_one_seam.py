"""The choice between the sanitizer's C parts and their Python references is
made in one module, ``native.py``: no other module of the sanitizer package
imports ``native``, ``native_parts`` or an extension of the package, or
names an extension's module, so the Python reference never calls C.

Two imports are the seam's own: ``sanitizer.py`` takes ``Parts`` and
``default`` from native.py (a sanitizer is built with them), and
``trace_bridge.py`` is the GPU trace bridge's loader (a ctypes library, not
an extension), which reads the switch."""
import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "npu_lifetime" / "sanitizer"
_SETUP = (ROOT / "setup.py").read_text()
# every extension of the package setup.py builds (its last name: _frames, _scan, ..., _holds)
EXTENSIONS = frozenset(name.rsplit(".", 1)[1] for name in re.findall(r'Extension\("npu_lifetime\.([\w.]+)"', _SETUP)
                       if "." in name)
LOADERS = frozenset({"native", "native_parts"})
# (module, imported module, names) allowed
SEAM_IMPORTS = {("sanitizer.py", "native", frozenset({"Parts", "default"})),
                ("trace_bridge.py", "native_parts", frozenset({"ENABLED"}))}


def _module_names(node) -> list:
    """The dotted names an import statement brings in, by their parts."""
    if isinstance(node, ast.Import):
        return [alias.name.split(".") for alias in node.names]
    base = (node.module or "").split(".") if node.module else []
    return [base + [alias.name] for alias in node.names] if not base else [base]


def violations(source: str, filename: str) -> list:
    """Where ``source`` imports or names a C part, or native.py's choice."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for parts in _module_names(node):
                if set(parts) & (EXTENSIONS | LOADERS):
                    names = frozenset(alias.name for alias in node.names)
                    if (filename, parts[-1], names) not in SEAM_IMPORTS:
                        found.append(f"line {node.lineno}: imports {'.'.join(parts)}")
        elif isinstance(node, ast.Name) and node.id in LOADERS:
            found.append(f"line {node.lineno}: reads {node.id}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                any(node.value.endswith("." + e) for e in EXTENSIONS):
            found.append(f"line {node.lineno}: names the extension {node.value!r}")
        elif isinstance(node, ast.Call) and _called(node) in _IMPORTERS:
            found += [f"line {node.lineno}: loads {a.value!r}" for a in node.args
                      if isinstance(a, ast.Constant) and a.value in EXTENSIONS]
    return found


_IMPORTERS = {"load", "import_module", "__import__", "_load"}


def _called(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def test_the_setup_names_the_sanitizer_extensions():
    assert {"_frames", "_scan", "_op_feed", "_dispatch", "_threads", "_event_hook", "_holds"} <= EXTENSIONS


MODULES = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "native.py")


@pytest.mark.parametrize("name", MODULES)
def test_no_module_but_native_chooses_c(name):
    assert violations((PACKAGE / name).read_text(), name) == []


@pytest.mark.parametrize("source", [
    "from . import native",
    "from .native import frames as _native_frames",
    "from . import accesses, native",
    "from ..native_parts import load",
    "import npu_lifetime.sanitizer._scan",
    "x = native.scan",
    "load('npu_lifetime.sanitizer._frames')",
    "importlib.import_module('_threads')",
])
def test_the_check_sees_each_way_of_reaching_c(source):
    assert violations(source, "hub.py"), source


def test_the_seams_own_imports_pass():
    assert violations("from .native import Parts, default as default_parts", "sanitizer.py") == []
    assert violations("from .native import Parts, default, frames", "sanitizer.py")  # more than the two
