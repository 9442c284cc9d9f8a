"""Checks of the shim's Python API arguments, before they reach ctypes.

ctypes converts silently where a user made a mistake (a ``str`` passed as a
pointer becomes the address of its bytes, ``2**40`` as a device is
truncated, ``-1`` as an unsigned size wraps) and fails with "argument 1:
TypeError: wrong type" elsewhere.  Each function here returns the value as
the C ABI wants it, or raises TypeError / ValueError naming the argument,
what it got, and what it takes.  Problems only the shim can see (an unknown
pointer, a double free) stay its structured findings.
"""
from __future__ import annotations

import math
import operator

_U64 = 1 << 64
_INT_MAX = (1 << 31) - 1


def _whole(value, name: str, what: str) -> int:
    """An int (or anything with ``__index__``), never a bool."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be {what}, not the bool {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be {what}, not {type(value).__name__} {value!r}") from None


def address(value, name: str = "ptr",
            what: str = "an address (an int, e.g. tensor.untyped_storage().data_ptr())") -> int:
    """A device address (or another handle the C ABI takes as a pointer): an int in [0, 2**64)."""
    value = _whole(value, name, what)
    if not 0 <= value < _U64:
        raise ValueError(f"{name} must be {what} in [0, 2**64), not {value}")
    return value


def stream(value, name: str = "stream") -> int:
    """A stream: the runtime's handle as an int (0: the default stream)."""
    for attribute in ("cuda_stream", "npu_stream"):
        if hasattr(type(value), attribute):  # on the type: torch_npu's property drains its task queue
            raise TypeError(
                f"{name} must be the runtime's stream handle (an int), not the stream object {value!r}: "
                f"pass its .{attribute}"
            )
    what = "a stream handle (an int; any non-zero int under the simulated runtime)"
    value = _whole(value, name, what)
    if not 0 <= value < _U64:
        raise ValueError(f"{name} must be {what} in [0, 2**64), not {value}")
    return value


def device(value, name: str = "device") -> int:
    """A device index: an int >= 0."""
    what = "a device index (an int >= 0)"
    value = _whole(value, name, what)
    if not 0 <= value <= _INT_MAX:
        raise ValueError(f"{name} must be {what}, not {value}")
    return value


def stream_device(value) -> int:
    """The device of a stream, or -1 when the shim should find it."""
    value = _whole(value, "stream_device", "a device index (an int >= 0), or -1 for the stream's own")
    if not -1 <= value <= _INT_MAX:
        raise ValueError(f"stream_device must be a device index (an int >= 0), or -1, not {value}")
    return value


def size(value, name: str = "size") -> int:
    """A byte count of a request: an int in [0, 2**63)."""
    value = _whole(value, name, "a number of bytes (an int >= 0)")
    if not 0 <= value < 1 << 63:
        raise ValueError(f"{name} must be a number of bytes (an int >= 0), not {value}")
    return value


def count(value, name: str) -> int:
    """A capacity or limit: an int in [0, 2**64)."""
    value = _whole(value, name, "an int >= 0")
    if not 0 <= value < _U64:
        raise ValueError(f"{name} must be an int in [0, 2**64), not {value}")
    return value


from ..flags import flag  # noqa: E402,F401  (one rule for booleans across the package)


def fraction(value) -> float:
    """A memory fraction in [0, 1] (1: the whole device, the default)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"the memory fraction must be a number in [0, 1], not {type(value).__name__} {value!r}")
    if math.isnan(value) or not 0.0 <= value <= 1.0:
        raise ValueError(f"the memory fraction must be in [0, 1] (1: the whole device), not {value}")
    return float(value)


def pool(value) -> tuple:
    """A graph pool id: torch's MempoolId_t, a pair of ints in [0, 2**64)."""
    what = "a graph pool id (a pair of ints, as torch's graph_pool_handle())"
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise TypeError(f"pool must be {what}, not {type(value).__name__} {value!r}")
    return tuple(count(part, f"pool[{i}]") for i, part in enumerate(value))


def text(value, name: str, choices: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str ({choices}), not {type(value).__name__} {value!r}")
    return value
