"""npu_lifetime: allocator-level cross-stream lifetime checking for PyTorch.

Its parts:

- ``shim/``: the Python binding of the native allocator shim
  (``allocator_shim/``): ``install()``, torch's memory functions over it
  (``npu_lifetime.memory``);
- ``recording/``: ``record_use``, ``record_stream``, ``erase_stream``, and
  record_use's fallback under the native caching allocators;
- ``lifetime/``: the lifetime model (happens-before and coverage);
- ``sanitizer/``: the torch front end that feeds the model from a running
  program;
- ``simdevice``: simulated streams and events for CPU tensors;
- ``schedules/``: simulated stream schedules, their oracle and executor, the
  fuzzer, hypothesis strategies (public as ``npu_lifetime.strategies``);
- ``handoff/``, ``fsdp2``: FSDP-style hand-offs and FSDP2 migrated to
  record_use;
- ``viz/``: pictures of block lifetimes;
- ``cli`` (``npu-lifetime``), ``pytest_plugin``, and ``user_script``, which
  runs a user's script for the commands.

The pure-Python parts (``lifetime``, ``schedules``, ``strategies``, ``shim``)
import without torch; ``install`` and ``record_use`` import it on first use.
"""
__version__ = "0.1.0"


def install(device: str = "cuda", **options):
    """Installs the allocator shim for ``device`` (see ``npu_lifetime.shim.install.install``:
    ``policy="lazy_wait"``, ``debug=False``, ``quarantine_bytes``)."""
    from .shim.install import install as _install

    return _install(device, **options)


def __getattr__(name: str):
    # ``record_use`` is recording.record_use itself once first looked up: a
    # wrapper here would cost an import statement (about 1 us) on every call
    if name == "record_use":
        from .recording import record_use

        globals()["record_use"] = record_use
        return record_use
    raise AttributeError(f"module 'npu_lifetime' has no attribute {name!r}")


def record_stream(tensor, stream) -> None:
    """See ``npu_lifetime.recording.record_stream``."""
    from .recording import record_stream as _record_stream

    _record_stream(tensor, stream)


def erase_stream(tensor, stream) -> None:
    """See ``npu_lifetime.recording.erase_stream``."""
    from .recording import erase_stream as _erase_stream

    _erase_stream(tensor, stream)


def _process_sanitizer_from_environment() -> None:
    """``NPU_LIFETIME_SANITIZER`` checks a program that imports only
    ``npu_lifetime`` (most do, for ``record_use``): the sanitizer package,
    whose import starts the process-wide sanitizer, is imported with it."""
    from .flags import env_choice

    if env_choice("NPU_LIFETIME_SANITIZER"):
        from . import sanitizer  # noqa: F401


_process_sanitizer_from_environment()
