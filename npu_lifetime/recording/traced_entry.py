"""What torch.compile traces in place of a C entry point: dynamo cannot
trace C, so ``substitute_in_graph`` gives it a Python function to follow.

Registering needs ``torch._dynamo``, whose import takes seconds: a process
that never compiles should not pay it.  So the registration waits for
dynamo's own import (a finder on ``sys.meta_path`` that wraps its loader),
or happens at once where dynamo is already imported."""
from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import threading
import warnings
from typing import Callable

_DYNAMO = "torch._dynamo"
_pending: list = []  # (c_function, polyfill) not yet registered
_lock = threading.Lock()


def substitute_when_traced(c_function: Callable, polyfill: Callable) -> None:
    """Dynamo follows ``polyfill`` wherever it meets ``c_function``."""
    if _DYNAMO in sys.modules:
        _register(c_function, polyfill)
        return
    with _lock:
        _pending.append((c_function, polyfill))
        if not any(isinstance(f, _OnDynamoImport) for f in sys.meta_path):
            sys.meta_path.insert(0, _OnDynamoImport())


def _register(c_function: Callable, polyfill: Callable) -> None:
    try:
        sys.modules[_DYNAMO].substitute_in_graph(c_function)(polyfill)
    except (ValueError, TypeError, AttributeError) as err:  # already registered, or an API change
        warnings.warn(f"npu_lifetime: torch.compile cannot trace {c_function!r} ({err})", RuntimeWarning,
                      stacklevel=2)


def _register_pending() -> None:
    with _lock:
        pending = _pending[:]
        _pending.clear()
    for c_function, polyfill in pending:
        _register(c_function, polyfill)


class _Loader(importlib.abc.Loader):
    """dynamo's own loader, then the pending registrations."""

    def __init__(self, loader) -> None:
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        self.loader.exec_module(module)
        _register_pending()

    def __getattr__(self, name):  # get_code, get_source, ...: dynamo's loader's
        return getattr(self.loader, name)


class _OnDynamoImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _DYNAMO:
            return None
        sys.meta_path.remove(self)  # once: the real finders find it
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec
