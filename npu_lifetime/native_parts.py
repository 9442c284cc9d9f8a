"""The package's optional C extensions (each with a pure-Python equivalent):
where they are loaded from, and the switch that turns them all off
(``NPU_LIFETIME_NATIVE=0``: the pure-Python paths, which CI also runs)."""
from __future__ import annotations

import importlib
import os

ENABLED = os.environ.get("NPU_LIFETIME_NATIVE", "1") != "0"


def load(module: str):
    """The extension ``module`` (a full dotted name), or None where it was
    not built or the native parts are turned off."""
    if not ENABLED:
        return None
    try:
        return importlib.import_module(module)
    except ImportError:  # not built (no compiler or Python headers at install)
        return None
