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

_NO_DATA_FACTORY = re.compile(r"^(aten::)?(new_)?empty(_like|_strided|_permuted)?$")


@dataclass
class StorageAccess:
    storage: int  # the storage's base address
    nbytes: int
    is_write: bool
    tensor: torch.Tensor  # one tensor on it (the simulated device watches it)
    names: list = field(default_factory=list)  # argument names, for reports
    device_index: int = 0
    fresh: bool = False  # seen as a fresh output of the op


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)


def bound_arguments(schema, args: tuple, kwargs: dict) -> Iterator[tuple]:
    yield from zip(schema.arguments, args)
    if kwargs:
        by_name = {a.name: a for a in schema.arguments[len(args):]}
        for name, value in kwargs.items():
            if name in by_name:
                yield by_name[name], value


def _returns(schema, outputs: Any) -> Iterator[tuple]:
    if len(schema.returns) == 1:
        yield schema.returns[0], outputs
    elif isinstance(outputs, (list, tuple)):
        yield from zip(schema.returns, outputs)


def op_accesses(func, args: tuple, kwargs: dict, outputs: Any, tracked: Callable) -> list:
    """The storages ``func`` touched, for tensors ``tracked(t)`` accepts."""
    schema = func._schema
    found: dict = {}

    def note(t: torch.Tensor, is_write: bool, name: str, fresh: bool = False) -> None:
        if not tracked(t):
            return
        try:
            storage = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse, nested, meta...
            return
        ptr = storage.data_ptr()
        if ptr == 0:
            return
        entry = found.get(ptr)
        if entry is None:
            entry = found[ptr] = StorageAccess(ptr, storage.nbytes(), False, t, [], t.device.index or 0)
        entry.is_write |= is_write
        entry.fresh |= fresh
        entry.names.append(name)

    for argument, value in bound_arguments(schema, args, kwargs):
        alias = argument.alias_info
        if alias is not None and not alias.is_write:
            continue
        for t in _tensors(value):
            note(t, alias is not None, argument.name)
    if not _NO_DATA_FACTORY.match(schema.name):
        for ret, value in _returns(schema, outputs):
            if ret.alias_info is None:
                for t in _tensors(value):
                    note(t, True, ret.name or "output", fresh=True)
    return list(found.values())
