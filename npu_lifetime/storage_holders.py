"""The plain tensors that hold a tensor's memory.

Tracking and lifetime calls work on storages; most tensors have one
(``untyped_storage()``).  Some do not, and hold their memory in other
tensors; each is mapped here, once, for the sanitizer's scan and for
``record_use`` / ``record_stream`` alike:

- sparse COO: its indices and values;
- sparse compressed (CSR, CSC, BSR, BSC): its compressed indices, plain
  indices and values;
- functorch-wrapped (``torch.func`` transforms' ``TensorWrapper``,
  ``BatchedTensor``): the tensor it wraps, unwrapped level by level;
- nested (strided layout): its buffer (``values()``), a plain tensor;
  the jagged layout is a wrapper subclass and flattens to its parts.

A tensor none of these fit (a custom TensorImpl without storage) has no
holders: ``holders`` returns ``()``; one whose storage shows no memory (a
wrapper subclass that does not flatten) is its own, empty, holder.
``unchecked_kind`` names either for the sanitizer's "not checked" line.  Meta tensors hold no memory: they
have nothing to check and are not listed.
"""
from __future__ import annotations

from typing import Optional

import torch

_COMPRESSED = {
    torch.sparse_csr: ("crow_indices", "col_indices"),
    torch.sparse_bsr: ("crow_indices", "col_indices"),
    torch.sparse_csc: ("ccol_indices", "row_indices"),
    torch.sparse_bsc: ("ccol_indices", "row_indices"),
}


def _functorch():
    return getattr(torch._C, "_functorch", None)


def has_storage(t: torch.Tensor) -> bool:
    """Whether ``t.untyped_storage()`` answers (a plain strided tensor)."""
    try:
        t.untyped_storage()
        return True
    except (RuntimeError, NotImplementedError):
        return False


def holders(t: torch.Tensor) -> tuple:
    """The tensors with storages that hold ``t``'s memory: ``(t,)`` for a
    plain tensor; ``()`` for one with no memory or of a kind not known here."""
    parts = _parts(t)
    if parts is None:
        return (t,) if has_storage(t) else ()
    found: list = []
    for part in parts:
        if part is not None:
            found += holders(part)
    return tuple(found)


def other_holders(t: torch.Tensor) -> tuple:
    """``holders(t)`` without ``t`` itself: ``()`` for a plain tensor (its own
    holder) as for one with no memory to find."""
    found = holders(t)
    return () if len(found) == 1 and found[0] is t else found


def _parts(t: torch.Tensor) -> Optional[tuple]:
    """The tensors one level down, or None for a tensor that is its own holder."""
    layout = t.layout
    if layout is torch.sparse_coo:
        return (t._indices(), t._values())
    names = _COMPRESSED.get(layout)
    if names is not None:
        return (*(getattr(t, name)() for name in names), t.values())
    functorch = _functorch()
    if functorch is not None and functorch.is_functorch_wrapped_tensor(t):
        return (functorch.get_unwrapped(t),)
    if t.is_nested and type(t) is torch.Tensor:  # strided layout: one buffer
        return (t.values(),)
    return None


def unchecked_kind(t: torch.Tensor) -> Optional[str]:
    """A name for the kind of ``t``, a tensor none of whose memory could be
    found (no holders, or a storage that shows none); None when it has no
    memory to check (meta, no elements)."""
    if t.is_meta or t.numel() == 0:
        return None
    return f"{type(t).__module__}.{type(t).__qualname__} ({t.layout})"
