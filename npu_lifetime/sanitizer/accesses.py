"""Which storages an op reads and writes, from its schema.

* An input whose alias annotation is a write (``Tensor(a!)``: in-place and
  ``out=`` ops) is written; other tensor inputs are read.
* An input aliased without a write (``Tensor(a)``: views, ``detach``...) is
  metadata only: taking a view touches no data.
* A fresh output (no alias annotation) is written; an aliased output is the
  same storage as an input, already counted.
* ``empty``-like factories write nothing: the allocation is the only event.

Tracking is per storage: views and slices of one storage are one entry, and
an op that both reads and writes a storage writes it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

_NO_DATA_FACTORY = re.compile(r"^(aten::)?(new_)?empty(_like|_strided|_permuted)?$")


@dataclass(slots=True)
class StorageAccess:
    storage: int  # the storage's base address
    nbytes: int
    is_write: bool
    tensor: torch.Tensor  # one tensor on it (the simulated device watches it)
    names: list = field(default_factory=list)  # argument names, for reports
    device_index: int = 0
    fresh: bool = False  # seen as a fresh output of the op


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


_READ, _WRITE = False, True
_plans: dict = {}


def _plan(func) -> tuple:
    """Per op, computed once: for each argument, whether it is skipped
    (metadata only) or read or written; the returns that are fresh; and
    whether the op writes no data at all."""
    plan = _plans.get(func)
    if plan is None:
        schema = func._schema
        arguments = tuple(
            (a.name, None if a.alias_info is not None and not a.alias_info.is_write else a.alias_info is not None)
            for a in schema.arguments
        )
        fresh_returns = tuple(r.alias_info is None for r in schema.returns)
        plan = _plans[func] = (arguments, {a[0]: a for a in arguments}, fresh_returns,
                               bool(_NO_DATA_FACTORY.match(schema.name)))
    return plan


def _outputs(count: int, outputs: Any) -> tuple:
    if count == 1:
        return (outputs,)
    return tuple(outputs) if isinstance(outputs, (list, tuple)) else ()


def op_accesses(func, args: tuple, kwargs: dict, outputs: Any, tracked: Callable) -> list:
    """The storages ``func`` touched, for tensors ``tracked(t)`` accepts."""
    arguments, by_name, fresh_returns, writes_nothing = _plan(func)
    found: dict = {}

    def note(t: torch.Tensor, is_write: bool, name: str, fresh: bool = False) -> None:
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
            entry = found[ptr] = StorageAccess(ptr, storage.nbytes(), False, t, [], t.device.index or 0)
        entry.is_write |= is_write
        entry.fresh |= fresh
        entry.names.append(name)

    def note_argument(spec, value) -> None:
        name, mode = spec
        if mode is None:
            return
        for t in _tensors(value):
            note(t, mode, name)

    for spec, value in zip(arguments, args):
        note_argument(spec, value)
    for name, value in kwargs.items():
        spec = by_name.get(name)
        if spec is not None:
            note_argument(spec, value)
    if not writes_nothing:
        for fresh, value in zip(fresh_returns, _outputs(len(fresh_returns), outputs)):
            if fresh:
                for t in _tensors(value):
                    note(t, True, "output", fresh=True)
    return list(found.values())
