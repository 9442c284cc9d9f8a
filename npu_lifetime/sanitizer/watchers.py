"""Which sanitizers watch a device, for callers outside the dispatcher
(``npu_lifetime.recording``): a fast yes/no for the hot path, and the
delivery of record_use / record_stream / erase_stream calls to every
enabled sanitizer that tracks the tensor."""
from __future__ import annotations

from .backends import active_backend


def watching(device_type: str) -> bool:
    """True when an enabled sanitizer tracks tensors of ``device_type``
    ("cuda", "npu", or "cpu" for the simulated device)."""
    backend = active_backend()
    return backend is not None and backend.device_type == device_type


def notify(call: str, tensor, stream) -> None:
    """Tells each watching sanitizer of ``call`` ("record_use",
    "record_stream" or "erase_stream") on ``tensor`` for ``stream`` (a
    torch device stream or a ``simdevice.Stream``)."""
    backend = active_backend()
    if backend is None or backend.device_type != tensor.device.type:
        return
    getattr(backend.sink, call)(tensor, backend.stream_key(stream))
