"""Put on PYTHONPATH for the shim run only (run_suites.py does it): every
Python process a test starts (``python -c``, multiprocessing spawn, ...) gets
the shim as its CUDA allocator, as the pytest process does.

Nothing happens unless NPU_LIFETIME_UPSTREAM_ALLOCATOR=shim.  The shim is
installed right after ``import torch`` finishes (a process that never imports
torch is left alone) and only when CUDA is available; a failed install prints
a warning to stderr and the process goes on with torch's allocator.
"""
import os
import sys


def _install() -> None:
    try:
        import torch

        if not torch.cuda.is_available():
            return
        import npu_lifetime

        npu_lifetime.install("cuda")
    except Exception as err:  # noqa: BLE001 - must never break the process
        sys.stderr.write(f"npu_lifetime upstream sitecustomize: shim not installed in pid {os.getpid()}: {err!r}\n")


def _hook() -> None:
    import importlib.abc
    import importlib.util

    class _AfterTorch(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name != "torch":
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec("torch")
            if spec is None or spec.loader is None:
                return spec
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                _install()

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _AfterTorch())


if os.environ.get("NPU_LIFETIME_UPSTREAM_ALLOCATOR", "").strip().lower() == "shim":
    try:
        _hook()
    except Exception as _err:  # noqa: BLE001
        sys.stderr.write(f"npu_lifetime upstream sitecustomize: {_err!r}\n")
