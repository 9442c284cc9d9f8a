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
from . import calls, torch_allocator_fallback
from .torch_allocator_fallback import FALLBACK


def native_available() -> bool:
    """Whether record_use's C parts (``_entry.c``, ``_holds.cpp``) were built
    and are on (``NPU_LIFETIME_NATIVE`` is not 0)."""
    return calls._BUILT_ENTRY is not None and torch_allocator_fallback._native_holds is not None


def use_native(native: bool) -> None:
    """record_use's C parts, where built, or their Python references for
    what is made from now on: the entry's fast paths (``_entry.c`` or
    ``calls.py``) and the fallback's table (``_holds.cpp`` or
    ``_holds_py.py``).  The both-ways tests' one switch."""
    calls.use_native_entry(native)
    torch_allocator_fallback.use_native_table(native)


__all__ = [
    "FALLBACK", "RecordUseError", "erase_stream", "install_tensor_method", "native_available", "record_stream",
    "record_use", "record_use_op", "shim_route", "simulated_route", "stream_from_op_args",
    "uninstall_tensor_method", "use_native",
]
