"""npu_lifetime: allocator-level cross-stream lifetime checking for PyTorch.

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
