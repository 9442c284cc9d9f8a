"""Which storages an op reads and writes, from its schema.

* An input whose alias annotation is a write (``Tensor(a!)``: in-place and
  ``out=`` ops) is written; other tensor inputs are read.
* An input aliased without a write (``Tensor(a)``: views, ``detach``...) is
  metadata only: taking a view touches no data.  So are in-place view ops
  (tag ``inplace_view``: ``unsqueeze_``, ``t_``, ``as_strided_``...), which
  change a tensor's shape, not its data.
* A fresh output (no alias annotation) is written; an aliased output is the
  same storage as an input, already counted.
* ``empty``-like factories write nothing: their fresh output is only
  allocated.
* c10d collectives write and read the arguments their semantics say
  (``collectives.py``), not what their schemas' annotations say.

Tracking is per storage: views and slices of one storage are one entry, and
an op that both reads and writes a storage writes it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from . import collectives

_NO_DATA_FACTORY = re.compile(r"^(aten::)?(new_)?empty(_like|_strided|_permuted)?$")
_READ, _WRITE, _SKIP = False, True, None


@dataclass(slots=True)
class StorageAccess:
    storage: int  # the storage's base address
    nbytes: int
    is_write: bool
    tensor: torch.Tensor  # one tensor on it (the simulated device watches it)
    names: list = field(default_factory=list)  # argument names, for reports
    device_index: int = 0
    fresh: bool = False  # a fresh output of the op (allocated by it)
    accessed: bool = True  # False: allocated by the op, data untouched (``empty``)


@dataclass(frozen=True, slots=True)
class Plan:
    """Per op, computed once from its schema."""

    arguments: tuple  # (name, mode) per positional argument: _READ, _WRITE or _SKIP
    by_name: dict  # name -> (name, mode), for keyword arguments
    fresh_returns: tuple  # per return: whether it is a fresh storage
    allocates_only: bool  # an empty-like factory
    collective: bool  # a c10d collective (runs on its backend's stream)
    touches_data: bool  # False: nothing to do for this op (a view, an inplace view)


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    """Plain tensors in ``value``; a wrapper subclass (DTensor...) stands
    for the tensors it wraps, which hold the storage."""
    if isinstance(value, torch.Tensor):
        if is_traceable_wrapper_subclass(value):
            names, _ = value.__tensor_flatten__()
            for name in names:
                yield from _tensors(getattr(value, name))
        else:
            yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)


_plans: dict = {}


def plan(func) -> Plan:
    p = _plans.get(func)
    if p is None:
        p = _plans[func] = _make_plan(func)
    return p


def _make_plan(func) -> Plan:
    schema = func._schema
    semantics = collectives.semantics(schema.name)
    if semantics is not None:
        written, _ = semantics
        arguments = tuple((a.name, a.name in written) for a in schema.arguments)
        return Plan(arguments, {a[0]: a for a in arguments}, (), False, True, True)
    if torch.Tag.inplace_view in func.tags:
        return Plan((), {}, (), False, False, False)  # shape and strides only
    arguments = tuple(
        (a.name, _SKIP if a.alias_info is not None and not a.alias_info.is_write else a.alias_info is not None)
        for a in schema.arguments
    )
    fresh_returns = tuple(r.alias_info is None for r in schema.returns)
    touches = any(mode is not _SKIP for _, mode in arguments) or any(fresh_returns)
    return Plan(arguments, {a[0]: a for a in arguments}, fresh_returns,
                bool(_NO_DATA_FACTORY.match(schema.name)), False, touches)


def _outputs(count: int, outputs: Any) -> tuple:
    if count == 1:
        return (outputs,)
    return tuple(outputs) if isinstance(outputs, (list, tuple)) else ()


def op_accesses(func, args: tuple, kwargs: dict, outputs: Any, tracked: Callable) -> list:
    """The storages ``func`` touched, for tensors ``tracked(t)`` accepts, in
    argument order, then its fresh outputs."""
    p = plan(func)
    found: dict = {}

    def note(t: torch.Tensor, is_write: bool, name: str, fresh: bool = False, accessed: bool = True) -> None:
        if not tracked(t):
            return
        try:
            storage = t.untyped_storage()
            ptr = storage.data_ptr()
        except (RuntimeError, NotImplementedError):  # sparse, meta, storage-less...
            return
        if ptr == 0:
            return
        entry = found.get(ptr)
        if entry is None:
            entry = found[ptr] = StorageAccess(
                ptr, storage.nbytes(), False, t, [], t.device.index or 0, fresh, accessed)
        else:
            entry.fresh |= fresh
            entry.accessed |= accessed
        entry.is_write |= is_write
        entry.names.append(name)

    for (name, mode), value in zip(p.arguments, args):
        if mode is not _SKIP:
            for t in _tensors(value):
                note(t, mode, name)
    for name, value in kwargs.items():
        spec = p.by_name.get(name)
        if spec is not None and spec[1] is not _SKIP:
            for t in _tensors(value):
                note(t, spec[1], name)
    for fresh, value in zip(p.fresh_returns, _outputs(len(p.fresh_returns), outputs)):
        if fresh:
            for t in _tensors(value):
                note(t, not p.allocates_only, "out", fresh=True, accessed=not p.allocates_only)
    return list(found.values())
