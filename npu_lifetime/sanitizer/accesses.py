"""Which storages an op reads and writes, from its schema.

* An input whose alias annotation is a write (``Tensor(a!)``: in-place and
  ``out=`` ops) is written; other tensor inputs are read.
* An input aliased without a write (``Tensor(a)``: views, ``detach``...) is
  metadata only: taking a view touches no data.  So are in-place view ops
  (tag ``inplace_view``: ``unsqueeze_``, ``t_``, ``as_strided_``...), which
  change a tensor's shape, not its data, and the views whose schemas do not
  declare them (``_unsafe_view``, ``unsafe_split``...).
* Batch norms in training update ``running_mean`` and ``running_var`` in
  place, which their schemas do not declare (``native_batch_norm``,
  ``cudnn_batch_norm``, ``miopen_batch_norm``: torch's own ``SchemaInfo``
  lists them): written when the op's ``training`` flag is set, read otherwise.
* A fresh output (no alias annotation) is written; an aliased output is the
  same storage as an input, already counted, and so is an output the schema
  calls fresh that shares an input's storage (an alias the schema does not
  declare).
* A written argument whose storage the op moved to a new block (an ``out=``
  tensor too small for the result, ``torch.empty(0)`` most often: the kernel
  resizes it) is a fresh output: allocated by the op, on its stream
  (``written_storages`` notes the addresses before the op).
* ``empty``-like factories write nothing: their fresh output is only
  allocated.  ``*_like`` and ``new_*`` constructors, and the functional
  ``fill``, read nothing of their ``self`` (its shape, dtype and device only).
* ``resize_`` / ``resize_as_`` change shape only, unless the storage must
  grow: then its old bytes are copied into a new, larger block (a read of
  the old storage, before the op; a write of the new one, after it) and the
  old block is freed (``resize_accesses``).
* ``lift_fresh`` hands over a tensor built from host data (``torch.tensor``,
  ``as_tensor``, ``asarray``, ``from_numpy``): its storage is a fresh
  output, allocated and written on the current stream.
* c10d collectives write and read the arguments their semantics say
  (``collectives.py``), not what their schemas' annotations say.

Tracking is per storage: views and slices of one storage are one entry, and
an op that both reads and writes a storage writes it.
"""
from __future__ import annotations

import dataclasses
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from .. import storage_holders
from . import collectives

_NO_DATA_FACTORY = re.compile(r"^(aten::)?(new_)?empty(_like|_strided|_permuted)?$")
# constructors that take only their input's shape, dtype and device: zeros_like, randn_like, new_full...
_FROM_HOST_DATA = ("aten::lift_fresh", "aten::lift")
_RESIZE = ("aten::resize_", "aten::resize_as_")
_METADATA_INPUT = re.compile(r"^aten::(\w+_like|new_\w+|is_strides_like_format|fill)$")
_UNDECLARED_VIEWS = ("aten::_unsafe_view", "aten::unsafe_split", "aten::unsafe_split_with_sizes")
# ops that update their running statistics in training without declaring the write: torch's
# SchemaInfo (torch/csrc/utils/schema_info.cpp, its training ops) special-cases the same ones
_TRAINING_WRITES = ("aten::native_batch_norm", "aten::cudnn_batch_norm", "aten::miopen_batch_norm",
                    "aten::batch_norm", "aten::_batch_norm_impl_index", "aten::instance_norm")
_RUNNING_STATS = ("running_mean", "running_var")
_TRAINING_FLAGS = ("training", "use_input_stats")
_READ, _WRITE, _SKIP = False, True, None


class StorageAccess:
    """One storage an op touched (or, for an ``empty``-like factory, made).
    The slots are a subclass's: ``PythonStorageAccess``'s below, or those of
    the C scan's base, which the C op feed reads directly (``native.py``
    makes that class)."""

    __slots__ = ()

    def __init__(self, storage: int, tensor: torch.Tensor, device_index: int, fresh: bool, accessed: bool) -> None:
        self.storage = storage  # the storage's base address
        self.is_write = False
        self.tensor = tensor  # one tensor on it (the simulated device watches it)
        self.names: list = []  # argument names, for reports
        self.device_index = device_index
        self.fresh = fresh  # a fresh output of the op (allocated by it)
        self.accessed = accessed  # False: allocated by the op, data untouched (``empty``)

    @property
    def nbytes(self) -> int:
        return self.tensor.untyped_storage().nbytes()


class PythonStorageAccess(StorageAccess):
    """An entry made by the Python scan (``PythonScan``)."""

    __slots__ = ("storage", "is_write", "tensor", "names", "device_index", "fresh", "accessed")


@dataclass(frozen=True, slots=True)
class Plan:
    """Per op, computed once from its schema."""

    arguments: tuple  # (position, name, mode) per tensor argument: _READ or _WRITE
    by_name: dict  # name -> mode, for tensor arguments passed by keyword
    fresh_returns: tuple  # per return: whether it is a fresh storage
    allocates_only: bool  # an empty-like factory
    collective: bool  # a c10d collective (runs on its backend's stream)
    touches_data: bool  # False: nothing to do for this op (a view, an inplace view)
    resizes: bool = False  # Tensor.resize_ / resize_as_: may move the storage to a larger block
    training: Optional[tuple] = None  # (position, name) of a batch norm's training flag; when set:
    training_arguments: tuple = ()  # arguments' modes in training (a batch norm's running statistics)
    writes: bool = False  # some argument is written (``Tensor(a!)``): see written_storages
    name: str = ""  # the op's schema name (reading it from the schema costs more than a lookup)


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


_plans: dict = {}  # id(op) -> (op, plan): ops hash in Python, ids do not


def plan(func) -> Plan:
    entry = _plans.get(id(func))
    if entry is None or entry[0] is not func:
        entry = _plans[id(func)] = (func, dataclasses.replace(_make_plan(func), name=func._schema.name))
    return entry[1]


def _holds_tensors(argument) -> bool:
    return "Tensor" in str(argument.type)


def _make_plan(func) -> Plan:
    schema = func._schema
    semantics = collectives.semantics(schema.name)
    tensor_args = [(i, a) for i, a in enumerate(schema.arguments) if _holds_tensors(a)]
    if semantics is not None:
        written, _ = semantics
        arguments = tuple((i, a.name, a.name in written) for i, a in tensor_args)
        return Plan(arguments, {name: mode for _, name, mode in arguments}, (), False, True, True)
    if schema.name in _RESIZE:
        return Plan((), {}, (), False, False, False, resizes=True)  # see resize_accesses
    if torch.Tag.inplace_view in func.tags or schema.name in _UNDECLARED_VIEWS:
        return Plan((), {}, (), False, False, False)  # shape and strides only
    if schema.name in _FROM_HOST_DATA:
        # torch.tensor / as_tensor / asarray / from_numpy: the tensor built from host data, made
        # outside the dispatcher, is handed over here: a fresh storage written on the current stream
        # (on a device, the copy in runs there)
        return Plan((), {}, (True,), False, False, True)
    metadata_only = "self" if _METADATA_INPUT.match(schema.name) else None
    arguments = tuple(
        (i, a.name, a.alias_info is not None) for i, a in tensor_args
        if (a.alias_info is None or a.alias_info.is_write)  # an alias without a write is a view: no data
        and a.name != metadata_only
    )
    fresh_returns = tuple(r.alias_info is None and _holds_tensors(r) for r in schema.returns)
    touches = bool(arguments) or any(fresh_returns)
    return Plan(arguments, {name: mode for _, name, mode in arguments}, fresh_returns,
                bool(_NO_DATA_FACTORY.match(schema.name)), False, touches,
                writes=any(mode for _, _, mode in arguments), **_training_writes(schema, arguments))


def _training_writes(schema, arguments: tuple) -> dict:
    """The plan's ``training`` fields for a batch norm (none for other ops)."""
    flag = next(((i, a.name) for i, a in enumerate(schema.arguments) if a.name in _TRAINING_FLAGS), None)
    if schema.name not in _TRAINING_WRITES or flag is None:
        return {}
    in_training = tuple((i, name, mode or name in _RUNNING_STATS) for i, name, mode in arguments)
    return {"training": flag, "training_arguments": in_training}


def _in_training(p: Plan, args: tuple, kwargs: dict) -> bool:
    position, name = p.training
    return bool(args[position] if position < len(args) else kwargs.get(name, False))


def _outputs(count: int, outputs: Any) -> tuple:
    if count == 1:
        return (outputs,)
    return tuple(outputs) if isinstance(outputs, (list, tuple)) else ()


def written_storages(p: Plan, args: tuple, kwargs: dict, scan=None) -> list:
    """Before the op runs: (tensor, storage address) of each tensor it
    writes, for ``op_accesses`` to see which of them it moved (``scan``:
    what runs the loop, ``PythonScan`` unless given)."""
    return (scan or PythonScan).written(p.arguments, args, kwargs)


def _address(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return 0


def op_accesses(func, args: tuple, kwargs: dict, outputs: Any, tracked: Callable, p: Plan = None,
                written_before: Optional[list] = None, scan=None) -> list:
    """The storages ``func`` touched, for tensors ``tracked(t)`` accepts, in
    argument order, then its fresh outputs (``p``: its plan, if at hand;
    ``written_before``: ``written_storages`` before the op, if taken;
    ``scan``: what runs the scan, ``PythonScan`` unless given)."""
    if p is None:
        p = plan(func)
    arguments = p.arguments
    if p.training is not None and _in_training(p, args, kwargs):
        arguments = p.training_arguments
    by_name = p.by_name if arguments is p.arguments else {name: mode for _, name, mode in arguments}
    return (scan or PythonScan).op(arguments, by_name, p.fresh_returns, not p.allocates_only, args, kwargs,
                                   outputs, tracked, written_before)


class PythonScan:
    """The scan of an op's tensor arguments, in Python (the reference); the
    C scan (``native.py``) has the same two functions."""

    @staticmethod
    def written(arguments: tuple, args: tuple, kwargs: dict) -> list:
        """(tensor, storage address) of each tensor of a written argument."""
        found = []
        for i, name, mode in arguments:
            value = args[i] if i < len(args) else kwargs.get(name)
            if mode and value is not None:
                found += [(t, _address(t)) for t in _tensors(value)]
        return found

    @staticmethod
    def op(arguments: tuple, by_name: dict, fresh_returns: tuple, written: bool, args: tuple, kwargs: dict,
           outputs: Any, tracked: Callable, written_before: Optional[list]) -> list:
        """An op's ``StorageAccess`` entries: its ``arguments`` (position,
        name, mode), those passed by keyword (``by_name``), its fresh
        outputs (written unless ``written`` is False: an empty-like
        factory's), and the written arguments it moved to a new block."""
        found: dict = {}
        count = len(args)
        for i, name, mode in arguments:
            if i < count:
                _note_all(found, args[i], mode, name, False, tracked)
        if kwargs:
            for name, value in kwargs.items():
                mode = by_name.get(name)
                if mode is not None:
                    _note_all(found, value, mode, name, False, tracked)
        if fresh_returns:
            for fresh, value in zip(fresh_returns, _outputs(len(fresh_returns), outputs)):
                if fresh:
                    _note_all(found, value, written, "out", True, tracked)
        if written_before:
            for t, before in written_before:
                entry = found.get(_address(t))
                if entry is not None and entry.storage != before:  # moved to a block the op allocated
                    entry.fresh = True
        return list(found.values()) if found else []


def _note_all(found: dict, value, is_write: bool, name: str, fresh: bool, tracked: Callable) -> None:
    if type(value) is torch.Tensor or type(value) is torch.nn.Parameter:  # the common case
        _note(found, value, is_write, name, fresh, tracked)
    elif value is not None and not isinstance(value, (int, float, bool)):
        for t in _tensors(value):
            _note(found, t, is_write, name, fresh, tracked)


def _note(found: dict, t: torch.Tensor, is_write: bool, name: str, fresh: bool, tracked: Callable) -> None:
    if not tracked(t):
        return
    try:
        ptr = t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # sparse, functorch-wrapped...: the tensors holding its memory
        for part in _holders(t):
            _note(found, part, is_write, name, fresh, tracked)
        return
    if ptr == 0:  # no memory, or memory this storage does not show: the tensors that hold it, if any
        for part in _holders(t):
            _note(found, part, is_write, name, fresh, tracked)
        return
    entry = found.get(ptr)
    if entry is None:
        # an empty-like factory's output is allocated, not accessed
        entry = found[ptr] = PythonStorageAccess(ptr, t, max(t.get_device(), 0), fresh, not fresh or is_write)
    elif fresh and not entry.fresh:
        # an output the schema calls fresh on an input's storage is an alias the schema does not
        # declare (aten::_unsafe_view): a view, no data written
        return
    else:
        entry.fresh |= fresh
        entry.accessed |= not fresh or is_write
    entry.is_write |= is_write
    entry.names.append(name)


UNCHECKED: Counter = Counter()  # kind -> tensors of it seen by ops with memory that cannot be tracked


def _holders(t: torch.Tensor) -> tuple:
    """The tensors holding the memory of ``t``, a tensor without a storage of
    its own or with one that shows no memory (``storage_holders``), never
    ``t`` itself; a kind with none is counted in ``UNCHECKED``."""
    found = storage_holders.other_holders(t)  # () for a storage that shows no memory (a wrapper subclass's)
    if not found:
        kind = storage_holders.unchecked_kind(t)
        if kind is not None:
            UNCHECKED[kind] += 1
    return found


def growing_storage(func, args: tuple, tracked: Callable):
    """For ``resize_`` / ``resize_as_`` about to run: the tensor whose
    storage must grow to a new block, or None.  (``resize_bytes`` copies the
    old bytes to the new block and frees the old one.)"""
    if not args or not isinstance(args[0], torch.Tensor) or not tracked(args[0]):
        return None
    t = args[0]
    if func._schema.name == "aten::resize_as_":
        size = args[1].shape if len(args) > 1 and isinstance(args[1], torch.Tensor) else None
    else:
        size = args[1] if len(args) > 1 else None
    if size is None:
        return None
    numel = 1
    for n in size:
        numel *= int(n)
    needed = (t.storage_offset() + numel) * t.element_size() if numel else 0
    try:
        storage = t.untyped_storage()
        return t if needed > storage.nbytes() else None
    except (RuntimeError, NotImplementedError):
        return None


def resize_accesses(t: torch.Tensor, before: int, write: bool) -> list:
    """The old storage's read (``write`` False, at address ``before``) or
    the new storage's write by a growing resize."""
    ptr = before if not write else t.untyped_storage().data_ptr()
    if not ptr:
        return []
    entry = PythonStorageAccess(ptr, t, max(t.get_device(), 0), fresh=write, accessed=True)
    entry.is_write = write
    entry.names.append("self")
    return [entry]
