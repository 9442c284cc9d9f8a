"""A corpus of publicly reported cross-stream lifetime and ordering bugs.

Each case (``cases/``) reproduces one public report's pattern (its streams,
its op sequence and its fix) as a small program with a buggy form, the
upstream fix and, where a free is involved, the record_use form.  ``verdicts``
runs each form under the sanitizer exactly as ``npu-lifetime check`` does;
``corruption`` runs them on a real device under the shim's debug mode with a
slow kernel, to see the bug in the data; ``oracle`` runs them under
compute-sanitizer, an independent checker of stream-ordered lifetimes;
``table`` puts it together (``npu-lifetime corpus``).
"""
import importlib
import pkgutil

from . import cases as _cases_package
from .case import FORMS, Case


def case_modules() -> dict:
    """name -> module of every case, in name order."""
    found = {}
    for info in sorted(pkgutil.iter_modules(_cases_package.__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{_cases_package.__name__}.{info.name}")
        found[module.CASE.name] = module
    return found


__all__ = ["FORMS", "Case", "case_modules"]
