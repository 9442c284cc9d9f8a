"""The checks of what the sanitizer's public methods are given: each
refuses bad input with one message (a TypeError or ValueError naming the
argument) before anything changes."""
from __future__ import annotations

import os
from typing import Optional

import torch

from .suppressions import Suppressions

FINDING_KINDS = frozenset({"data_race", "uncovered_free", "reuse_race", "invalid_free", "use_after_free",
                           "unrecorded_event_wait"})


def findings(call: str, value) -> Optional[list]:
    """None, or a list (or tuple) of findings this sanitizer made."""
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise TypeError(f"{call}: findings must be a list of findings (from .findings or .flush()), "
                        f"not {type(value).__name__} {value!r:.60}")
    for item in value:
        finding(call, item)
    return list(value)


def finding(call: str, value):
    if getattr(type(value), "kind", None) not in FINDING_KINDS and getattr(value, "kind", None) not in FINDING_KINDS:
        raise TypeError(f"{call}: {value!r:.60} is not a finding (from .findings or .flush())")
    return value


def stream_key(call: str, key) -> tuple:
    """A stream key: (device index, stream handle), two ints (``backend.stream_key(stream)`` makes one)."""
    if not (type(key) is tuple and len(key) == 2 and all(isinstance(k, int) and not isinstance(k, bool)
                                                          for k in key)):
        raise TypeError(f"{call}: a stream key is (device index, stream handle), two ints "
                        f"(sanitizer.backend.stream_key(stream) makes one), not {key!r:.60}")
    return key


def tensor(call: str, value) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{call}: needs a tensor, not {type(value).__name__}")
    return value


def suppressions(value) -> Suppressions:
    """None, the path of a suppressions file, or a ``Suppressions``."""
    if value is None or isinstance(value, (str, os.PathLike)):
        return Suppressions.load(os.fspath(value) if value is not None else None)
    if isinstance(value, Suppressions):
        return value
    raise TypeError(f"suppressions must be None, the path of a suppressions file or a Suppressions, "
                    f"not {type(value).__name__} {value!r:.60}")
