"""record_use, record_stream and erase_stream: where each call goes
(``calls.py``: the shim's route, the custom op a sanitizer or a compiler
sees), record_use under the native caching allocator when the shim is not
installed (``torch_allocator_fallback.py``), and the hook through which the
sanitizers watch these calls (``watchers.py``)."""
from .calls import (
    RecordUseError,
    erase_stream,
    install_tensor_method,
    record_stream,
    record_use,
    record_use_op,
    shim_route,
    simulated_route,
    stream_from_op_args,
    uninstall_tensor_method,
)
from .torch_allocator_fallback import FALLBACK

__all__ = [
    "FALLBACK", "RecordUseError", "erase_stream", "install_tensor_method", "record_stream", "record_use",
    "record_use_op", "shim_route", "simulated_route", "stream_from_op_args", "uninstall_tensor_method",
]
