"""An independent reference for the sanitizer's front end (``accesses.py``),
and a survey that checks one against the other over torch's OpInfo samples.

The front end derives, from each aten op's schema, which storages the op
reads, which it writes and which outputs are fresh.  The reference derives
the same from what the op does, per aten op call seen under dispatch (so a
composite op is checked as the aten ops it decomposes into), by running the
op again on copies of its inputs' storages, taken before the real call (the
program's own tensors are never touched, and torch's RNG state is put back):

* Baseline: the op runs on unchanged copies, torch's CPU RNG seeded alike
  before each run, twice, each time just after blocks of its outputs' sizes
  were filled with a pattern and freed (two patterns): an output the op
  leaves unwritten (``empty_like``) holds the pattern and differs between
  the two.  What differs is noise, left out of every comparison below.
* Writes: a copied input storage whose bytes differ after a run from before
  it was written (in any run, the baseline's or a perturbed one's: ``relu_``
  of positive values, ``masked_fill_`` with an all-false mask show their
  writes in some perturbed run).  A storage the op moved to a new block
  (resized) is not written: its old block was freed.
* Fresh outputs: a result (an output, or a tensor argument after the op: an
  ``out=`` tensor the kernel resized) whose storage is none of the inputs'.
  An output on an input's storage is an alias (a view: no data).
* Reads: each input storage in turn is perturbed, six ways (scaled, random,
  reversed or shuffled, zeros, NaN and infinities, another input's bytes;
  integer ones are first shuffled, so that indices stay in range), and the
  op run again; then the same with the other inputs zeroed (``where`` with
  a true condition hides ``other``).  The op read that storage when the
  perturbation changed a fresh result's shape or values, a non-tensor
  result, an alias's shape, a written storage's final bytes, or whether the
  op raised.  No change after at least two perturbations that changed the
  storage, with something a read could have changed (values, a result, a
  written storage: not just shapes), is taken as proof that it did not.
  A missed read is checked once more with other patterns before it counts.

Nothing of the front end's rules is used here: only the data, the storages'
addresses and the schema's argument names (to name storages in reports).

The front end is asked as the sanitizer's dispatch mode asks it (``plan``,
``written_storages`` and ``op_accesses``; for ``resize_``
``growing_storage`` and ``resize_accesses``), on the real call's arguments
and outputs.

A disagreement is one of (per aten overload and argument names):

* ``missed-write``: the reference saw a storage written (or a fresh result)
  that the front end does not write (or does not call fresh);
* ``missed-read``: the reference saw the op depend on a storage the front end
  neither reads nor writes;
* ``write-not-observed``: the front end writes an input storage that no call
  of the op was seen to write;
* ``read-not-observed``: the front end reads a storage on which no call of
  the op was seen to depend, and some call proved that it did not.

The first two are misses: one call suffices.  The last two are
over-approximations of the front end (a read or write it reports that may
not happen): they count only when no call of that op showed the access,
since one sample can hide a read (``argmin`` of one element); an OpInfo
that showed one is run on more samples.

Each aten overload is analysed in its first CALLS_PER_OVERLOAD calls (more
while it has an unconfirmed over-approximation); later calls only run.
"""
from __future__ import annotations

import contextlib
import time
import warnings
from dataclasses import dataclass, field
from typing import Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from npu_lifetime.sanitizer import accesses

SEED = 20240617
PROOF = 2  # effective perturbations without a difference that prove "no read"
CALLS_PER_OVERLOAD = 12  # analyses of one aten overload; later calls are not analysed, unless needed (below)
MORE_SAMPLES = 8  # further samples of an OpInfo that showed an access the front end reports and no call showed


def _tracked(t: torch.Tensor) -> bool:
    return t.is_cpu  # the simulated device's backend tracks CPU tensors


# -- storages and copies ------------------------------------------------------------------------------------------
def _storage_ptr(t: torch.Tensor) -> Optional[int]:
    """The address of ``t``'s storage, None if it has no plain, nonempty one."""
    if t.layout != torch.strided or t.is_meta or not t.is_cpu:
        return None
    try:
        storage = t.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None
    return storage.data_ptr() if storage.nbytes() else None


def _as_bytes(storage: torch.UntypedStorage) -> torch.Tensor:
    """A copy of the storage's bytes."""
    return torch.empty(0, dtype=torch.uint8).set_(storage).clone()


def _same_bytes(before: torch.Tensor, storage: torch.UntypedStorage) -> bool:
    after = torch.empty(0, dtype=torch.uint8).set_(storage)
    if after.numel() < before.numel():
        return False
    return torch.equal(before, after[: before.numel()])  # a storage grown by resize_ keeps its old bytes


@dataclass(frozen=True)
class TensorView:
    """A tensor argument as it was before the op: its storage (None: no
    bytes) and its view of it."""

    ptr: Optional[int]
    dtype: torch.dtype
    offset: int
    size: tuple
    stride: tuple
    conj: bool
    neg: bool

    @classmethod
    def of(cls, t: torch.Tensor) -> "TensorView":
        return cls(_storage_ptr(t), t.dtype, t.storage_offset(), tuple(t.size()), tuple(t.stride()),
                   t.is_conj(), t.is_neg())

    def on(self, storage: torch.UntypedStorage) -> torch.Tensor:
        """This view on ``storage``."""
        rebuilt = torch.empty(0, dtype=self.dtype).set_(storage, self.offset, self.size, self.stride)
        torch._C._set_conj(rebuilt, self.conj)
        torch._C._set_neg(rebuilt, self.neg)
        return rebuilt


@dataclass
class InputStorage:
    """One storage the op's tensor arguments are on."""

    ptr: int
    storage: torch.UntypedStorage  # a copy of its bytes before the op
    dtype: torch.dtype  # of the first tensor seen on it: how to perturb it
    names: list = field(default_factory=list)  # the schema's names of the arguments on it

    @property
    def label(self) -> str:
        return "+".join(sorted(set(self.names)))


def _named_arguments(func, args: tuple, kwargs: dict) -> list:
    schema_args = func._schema.arguments
    named = [(schema_args[i].name if i < len(schema_args) else f"arg{i}", value) for i, value in enumerate(args)]
    return [*named, *kwargs.items()]


class Inputs(dict):
    """Address -> InputStorage of every tensor argument's storage, taken
    before the op; ``views``: id of each tensor argument -> its TensorView
    (the op can resize or restride its arguments)."""

    views: dict


def input_storages(func, args: tuple, kwargs: dict) -> Inputs:
    found = Inputs()
    found.views = {}
    for name, value in _named_arguments(func, args, kwargs):
        for leaf in tree_flatten(value)[0]:
            if not _plain(leaf):
                continue
            view = found.views[id(leaf)] = TensorView.of(leaf)
            if view.ptr is None:
                continue
            if view.ptr not in found:
                found[view.ptr] = InputStorage(view.ptr, leaf.untyped_storage().clone(), leaf.dtype)
            found[view.ptr].names.append(name)
    return found


def _plain(value) -> bool:
    return isinstance(value, torch.Tensor) and value.layout == torch.strided and value.is_cpu


# -- perturbations --------------------------------------------------------------------------------------------------
PERTURBATIONS = 6
_SPECIAL = (float("nan"), float("inf"), float("-inf"), 0.0, 1.0, -1.0, 1e30, -0.5)  # zeros, NaN, overflow...


def _perturb(storage: torch.UntypedStorage, dtype: torch.dtype, trial: int, other: Optional[torch.Tensor]) -> None:
    """Changes the storage's values in place: mild changes first (which keep
    a matrix invertible, an index in range), then zeros, special values, and
    ``other``'s bytes (another input's: ``eq`` and ``isin`` see equal values)."""
    size = torch.empty(0, dtype=dtype).element_size()
    if storage.nbytes() % size or dtype.is_floating_point and size < 2:
        dtype, size = torch.uint8, 1  # float8 and odd views: as bytes
    count = storage.nbytes() // size
    flat = torch.empty(0, dtype=dtype).set_(storage, 0, (count,), (1,))
    if trial == PERTURBATIONS - 1:
        if other is not None:
            _copy_bytes(storage, other)
        return
    if trial == PERTURBATIONS - 3:
        flat.zero_()
        return
    gen = torch.Generator().manual_seed(SEED + trial)
    shuffled = torch.randperm(count, generator=gen)
    if dtype.is_floating_point or dtype.is_complex:
        _perturb_floats(flat, trial, gen)
    elif dtype == torch.bool:
        flat.copy_((flat.logical_not(), torch.randint(0, 2, (count,), generator=gen).bool(),
                    flat[shuffled], torch.ones_like(flat))[min(trial, 3)])
    else:
        _perturb_integers(flat, trial, shuffled)


def _perturb_floats(flat: torch.Tensor, trial: int, gen: torch.Generator) -> None:
    if trial == 0:
        flat.mul_(1.25).add_(0.125)  # near the old values: a matrix stays invertible, a probability near [0, 1]
    elif trial == 1:
        flat.copy_(torch.randn(flat.numel(), generator=gen, dtype=flat.dtype))
    elif trial == 2:
        flat.copy_(flat.flip(0))  # the same values, elsewhere: argmin, sort...
    else:
        special = torch.tensor(_SPECIAL, dtype=torch.float64).to(flat.dtype)
        flat.copy_(special.repeat(flat.numel() // len(_SPECIAL) + 1)[: flat.numel()])


def _perturb_integers(flat: torch.Tensor, trial: int, shuffled: torch.Tensor) -> None:
    if trial == 0:
        flat.copy_(flat[shuffled])  # the same values elsewhere: indices stay in range
    elif trial == 1:
        flat.add_(1)
    elif trial == 2:
        flat.copy_(flat[shuffled].sub_(1))
    else:
        flat.fill_(flat.max() if flat.numel() else 0)


def _copy_bytes(storage: torch.UntypedStorage, source: torch.Tensor) -> None:
    """``source`` (bytes), repeated over the storage."""
    target = torch.empty(0, dtype=torch.uint8).set_(storage)
    if source.numel():
        target.copy_(source.repeat(target.numel() // source.numel() + 1)[: target.numel()])


def _other_bytes(inputs: dict, ptr: int) -> Optional[torch.Tensor]:
    """The bytes of another input storage of the same dtype, if any."""
    for other, entry in inputs.items():
        if other != ptr and entry.dtype == inputs[ptr].dtype:
            return _as_bytes(entry.storage)
    return None


# -- one run on copies ----------------------------------------------------------------------------------------------
@dataclass
class Run:
    error: Optional[str] = None
    written: set = field(default_factory=set)  # input storages whose bytes changed
    moved: set = field(default_factory=set)  # input storages the op moved to a new block
    observed: dict = field(default_factory=dict)  # what a read can change: key -> value
    fresh: dict = field(default_factory=dict)  # result label -> its storage (none of the inputs')
    fresh_bytes: list = field(default_factory=list)  # their sizes
    perturbed_changed: bool = True  # the perturbation changed the perturbed storage


def _output_view(t: torch.Tensor) -> tuple:
    return (tuple(t.shape), t.dtype, tuple(t.stride()), t.storage_offset(), t.is_conj(), t.is_neg())


def _values(t: torch.Tensor) -> torch.Tensor:
    plain = t.detach().resolve_conj().resolve_neg().contiguous().reshape(-1)
    return plain.view(torch.uint8) if plain.numel() else plain.to(torch.uint8)


def run_on_copies(func, args, kwargs, inputs: dict, perturbed: Optional[int] = None, trial: int = 0,
                  zeroed: frozenset = frozenset(), scribble: tuple = ((), 0x5A)) -> Run:
    """The op on copies of its input storages (those in ``zeroed`` zeroed,
    ``perturbed`` perturbed by ``trial``), blocks of ``scribble``'s sizes
    filled with its pattern and freed just before (see ``_scribble``)."""
    copies = {ptr: entry.storage.clone() for ptr, entry in inputs.items()}
    for ptr in zeroed:
        torch.empty(0, dtype=torch.uint8).set_(copies[ptr]).zero_()
    run = Run()
    if perturbed is not None:
        original = _as_bytes(copies[perturbed])
        _perturb(copies[perturbed], inputs[perturbed].dtype, trial, _other_bytes(inputs, perturbed))
        run.perturbed_changed = not _same_bytes(original, copies[perturbed])
    before = {ptr: _as_bytes(storage) for ptr, storage in copies.items()}
    rebuilt: dict = {}

    def rebuild(value):
        view = inputs.views.get(id(value)) if _plain(value) else None
        if view is None:
            return value
        if id(value) not in rebuilt:  # no bytes (an ``out=`` to resize): a storage of its own
            rebuilt[id(value)] = view.on(copies[view.ptr] if view.ptr is not None else torch.UntypedStorage(0))
        return rebuilt[id(value)]

    copy_args, copy_kwargs = tree_map(rebuild, args), tree_map(rebuild, kwargs)
    copy_ptrs = {storage.data_ptr(): ptr for ptr, storage in copies.items()}  # before: resize_ may move one
    torch.default_generator.manual_seed(SEED)  # torch.manual_seed also seeds CUDA, XPU...: 3 ms a call
    _scribble(*scribble)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            outputs = func(*copy_args, **copy_kwargs)
    except Exception as error:  # a perturbed value the op rejects: it looked at it
        run.error = type(error).__name__
        return run
    for address, ptr in copy_ptrs.items():
        storage = copies[ptr]
        if storage.data_ptr() != address:
            run.moved.add(ptr)  # resized into a new block (which is an output's): the old one was freed
        elif not _same_bytes(before[ptr], storage):
            run.written.add(ptr)
        run.observed[("storage", ptr)] = _as_bytes(storage)
    for label, leaf in result_leaves(func, outputs, copy_args, copy_kwargs):
        _observe_result(run, label, leaf, copy_ptrs)
    return run


def result_leaves(func, outputs, args: tuple, kwargs: dict) -> list:
    """(label, value) of what the op leaves: its outputs, then its tensor
    arguments (an ``out=`` tensor the op resized is on a new storage)."""
    leaves = [(f"output {i}", leaf) for i, leaf in enumerate(tree_flatten(outputs)[0])]
    for name, value in _named_arguments(func, args, kwargs):
        tensors = [leaf for leaf in tree_flatten(value)[0] if isinstance(leaf, torch.Tensor)]
        leaves += [(name if len(tensors) == 1 else f"{name}[{j}]", t) for j, t in enumerate(tensors)]
    return leaves


def _observe_result(run: Run, label: str, leaf, copy_ptrs: dict) -> None:
    if not isinstance(leaf, torch.Tensor):
        run.observed[("result", label)] = repr(leaf)
        return
    if leaf.layout != torch.strided:
        return
    run.observed[("shape", label)] = _output_view(leaf)
    ptr = _storage_ptr(leaf)
    if ptr is not None and ptr not in copy_ptrs:
        run.fresh[label] = ptr
        run.fresh_bytes.append(leaf.untyped_storage().nbytes())
        run.observed[("values", label)] = _values(leaf).clone()


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    return a == b


def _differing(a: dict, b: dict) -> set:
    return {key for key in a.keys() | b.keys() if key not in a or key not in b or not _same(a[key], b[key])}


# -- the reference's verdict for one call --------------------------------------------------------------------------
@dataclass
class Reference:
    written: set  # input storages written
    moved: set  # input storages moved to a new block (the tensor's new storage is a fresh output)
    read: dict  # input storage -> True (depends), False (proved not to), None (unknown)
    fresh: dict  # result label -> storage (in the baseline run)


def reference(func, args, kwargs, inputs: dict) -> Optional[Reference]:
    """None: the op cannot run on copies of its inputs (the call is not analysed)."""
    probe = run_on_copies(func, args, kwargs, inputs)
    if probe.error:
        return None
    scribble = (tuple(probe.fresh_bytes), 0x5A)
    first = run_on_copies(func, args, kwargs, inputs, scribble=scribble)
    second = run_on_copies(func, args, kwargs, inputs, scribble=(scribble[0], 0xA5))
    if first.error or second.error:
        return None
    noisy = _differing(first.observed, second.observed)
    written = first.written | second.written
    # a storage written in the baseline needs no read test: the front end must write it either way
    read = {ptr: None if ptr in first.written else
            _depends(func, args, kwargs, inputs, ptr, first, noisy, written, scribble) for ptr in inputs}
    return Reference(written=written - first.moved, moved=first.moved, read=read, fresh=first.fresh)


def _scribble(sizes: tuple, pattern: int) -> None:
    """Leaves blocks of the op's fresh outputs' sizes, filled with
    ``pattern``, free for the allocator to hand out next.  An output the op
    leaves unwritten (``empty_like``) then holds the pattern, not what an
    earlier run left there (a perturbed run's values would look like a
    read), and differs between the two baselines, which scribble two
    patterns: noise."""
    blocks = [torch.full((max(n, 1),), pattern, dtype=torch.uint8) for n in sizes for _ in range(2)]
    del blocks


def _depends(func, args, kwargs, inputs: dict, ptr: int, baseline: Run, noisy: set, written: set,
             scribble: tuple) -> Optional[bool]:
    """Whether the op depends on storage ``ptr``: True at the first
    perturbation that shows it; then, with the other inputs zeroed (``where``
    with a false condition, ``logical_or`` with a false ``other`` look at
    what a true one hides).  Adds the writes the runs show to ``written``."""
    others = frozenset(inputs) - {ptr}
    contexts = [frozenset(), others] if others else [frozenset()]
    effective = 0
    for zeroed in contexts:
        base = run_on_copies(func, args, kwargs, inputs, zeroed=zeroed, scribble=scribble) if zeroed else baseline
        if base.error is not None:
            continue
        watched = set(base.observed) - noisy - {("storage", ptr)}
        data = any(_holds_data(key, base, written) for key in watched)
        for trial in range(PERTURBATIONS):
            run = run_on_copies(func, args, kwargs, inputs, ptr, trial, zeroed, scribble)
            written |= run.written
            if not run.perturbed_changed:
                continue
            if run.error is not None:
                return True
            if any(key in watched for key in _differing(base.observed, run.observed)):
                return True
            effective += data
    return False if effective >= PROOF else None


def _holds_data(key: tuple, run: Run, written: set) -> bool:
    """Whether a read could show in what ``key`` names: a result, a
    nonempty fresh output's values, a storage the op writes (not a shape:
    an op with only an empty output or views proves nothing by not changing)."""
    kind, where = key
    if kind == "values":
        return run.observed[key].numel() > 0
    return kind == "result" or kind == "storage" and where in written


# -- the front end, asked as dispatch.py asks it ------------------------------------------------------------------
def front_end(func, args: tuple, kwargs: dict, run_real) -> tuple:
    """Runs the real op; returns (its outputs, the front end's StorageAccess list)."""
    plan = accesses.plan(func)
    if plan.resizes:
        growing = accesses.growing_storage(func, args, _tracked)
        before = growing.untyped_storage().data_ptr() if growing is not None else None
        outputs = run_real()
        if growing is None:
            return outputs, []
        found = accesses.resize_accesses(growing, before, write=False)
        if growing.untyped_storage().data_ptr() != before:
            found += accesses.resize_accesses(growing, before, write=True)
        return outputs, found
    if not plan.touches_data:
        return run_real(), []
    written_before = accesses.written_storages(plan, args, kwargs) if plan.writes else None
    outputs = run_real()
    return outputs, accesses.op_accesses(func, args, kwargs, outputs, _tracked, plan, written_before)


def op_name(func) -> str:
    return f"{func._schema.name}.{func._schema.overload_name or 'default'}"


# -- comparing the two ------------------------------------------------------------------------------------------------
MISSED_WRITE, MISSED_READ = "missed-write", "missed-read"
WRITE_NOT_OBSERVED, READ_NOT_OBSERVED = "write-not-observed", "read-not-observed"
NOT_COMPARED = "not-compared"  # the two name different storages: a bug of this reference or of the op


@dataclass
class Finding:
    """One storage of one call where the two may disagree."""

    op: str
    kind: str
    names: str
    confirms: bool = False  # for the over-approximations: this call did show the access
    storage: Optional[int] = None  # the input storage, for a missed read (see Observer._still_depends)

    @property
    def key(self) -> str:
        return f"{self.op}: {self.kind} {self.names}"


def compare(func, inputs: dict, ref: Reference, found: list, outputs, args: tuple, kwargs: dict) -> list:
    """Findings of one call (over-approximations with ``confirms`` set or not)."""
    op = op_name(func)
    by_storage = {a.storage: a for a in found}
    leaves = dict(result_leaves(func, outputs, args, kwargs))
    findings = []
    for ptr, entry in inputs.items():
        if ptr not in ref.moved:  # the old block of a moved storage is freed (dispatch reports it), not accessed
            findings += _compare_input(op, entry, ref, by_storage.get(ptr))
    fresh_here = set()
    for label in ref.fresh:
        real = _storage_ptr(leaves[label]) if isinstance(leaves.get(label), torch.Tensor) else None
        access = by_storage.get(real)
        if real is None or real in inputs:
            findings.append(Finding(op, NOT_COMPARED, f"{label} (fresh on copies, not here)"))
        elif access is None or not access.fresh:
            findings.append(Finding(op, MISSED_WRITE, label))
        fresh_here.add(real)
    for ptr, access in by_storage.items():
        if ptr not in inputs and ptr not in fresh_here:
            findings.append(Finding(op, NOT_COMPARED, f"storage of {'+'.join(access.names)}"))
    return findings


def _compare_input(op: str, entry: InputStorage, ref: Reference, access) -> list:
    fe_write = access is not None and access.is_write
    fe_read = access is not None and access.accessed and not access.is_write
    written, depends = entry.ptr in ref.written, ref.read.get(entry.ptr)
    if written and not fe_write:
        return [Finding(op, MISSED_WRITE, entry.label)]
    if fe_write:
        return [Finding(op, WRITE_NOT_OBSERVED, entry.label, confirms=written)]
    if fe_read and depends is not None:
        return [Finding(op, READ_NOT_OBSERVED, entry.label, confirms=depends)]
    if depends and not fe_read:
        return [Finding(op, MISSED_READ, entry.label, storage=entry.ptr)]
    return []


# -- the dispatch mode that does both per aten call ------------------------------------------------------------------
class Observer(TorchDispatchMode):
    """Per aten call: the reference on copies, then the real call and the
    front end on it; findings and counts go to ``survey``."""

    def __init__(self, survey: "Survey", opinfo, context: str) -> None:
        super().__init__()
        self.survey, self.opinfo, self.context = survey, opinfo, context

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        op = op_name(func)
        analysed = self.survey.analyses.get(op, 0) < CALLS_PER_OVERLOAD or op in self.survey.unsettled_ops()
        ref = None
        if analysed:
            inputs = input_storages(func, args, kwargs)
            rng = torch.random.get_rng_state()
            ref = self._guarded(op, lambda: reference(func, args, kwargs, inputs))
            torch.random.set_rng_state(rng)
        outputs, found = front_end(func, args, kwargs, lambda: func(*args, **kwargs))
        self.survey.seen.add(op)
        if ref is None:
            if analysed:
                self.survey.unanalysable.add(op)
            return outputs
        self.survey.analyses[op] = self.survey.analyses.get(op, 0) + 1
        self.survey.count(ref)
        for finding in self._guarded(op, lambda: compare(func, inputs, ref, found, outputs, args, kwargs)) or ():
            if finding.kind != MISSED_READ or self._guarded(
                    op, lambda ptr=finding.storage: self._still_depends(func, args, kwargs, inputs, ptr)):
                self.survey.add(finding, self.context, self.opinfo)
        return outputs

    @staticmethod
    def _still_depends(func, args, kwargs, inputs: dict, ptr: int) -> bool:
        """A missed read seen again with other scribble patterns: not an
        output left unwritten that happened to hold different garbage."""
        rng = torch.random.get_rng_state()
        probe = run_on_copies(func, args, kwargs, inputs)
        scribble = (tuple(probe.fresh_bytes), 0x33)
        base = run_on_copies(func, args, kwargs, inputs, scribble=scribble)
        other = run_on_copies(func, args, kwargs, inputs, scribble=(scribble[0], 0xCC))
        noisy = _differing(base.observed, other.observed)
        depends = _depends(func, args, kwargs, inputs, ptr, base, noisy, set(), scribble)
        torch.random.set_rng_state(rng)
        return bool(depends)

    def _guarded(self, op: str, work):
        """``work()``; an exception there is this module's bug (the op's own
        are caught around each run): recorded, not taken for the op's."""
        try:
            return work()
        except Exception as error:
            self.survey.errors.append(f"{op} in {self.context}: {error!r}")
            return None


# -- the survey over op_db -------------------------------------------------------------------------------------------
OVER_APPROXIMATIONS = (WRITE_NOT_OBSERVED, READ_NOT_OBSERVED)


@dataclass
class Survey:
    opinfos: int = 0  # OpInfos with at least one sample run
    samples: int = 0  # sample calls run (function, in-place and out= variants)
    seen: set = field(default_factory=set)  # aten overloads seen
    analyses: dict = field(default_factory=dict)  # aten overload -> calls analysed
    unanalysable: set = field(default_factory=set)  # overloads some call of which could not run on copies
    misses: dict = field(default_factory=dict)  # key -> the first OpInfo sample that showed it
    unconfirmed: dict = field(default_factory=dict)  # over-approximation key -> first sample
    confirmed: set = field(default_factory=set)  # over-approximation keys some call showed
    recheck: list = field(default_factory=list)  # OpInfos that showed an unconfirmed one: more samples
    errors: list = field(default_factory=list)  # exceptions of the reference itself
    verdicts: dict = field(default_factory=dict)  # the reference's verdict -> input storages (over all calls)
    seconds: float = 0.0

    def add(self, finding: Finding, context: str, opinfo) -> None:
        if finding.kind not in OVER_APPROXIMATIONS:
            self.misses.setdefault(finding.key, context)
        elif finding.confirms:
            self.confirmed.add(finding.key)
        else:
            self.unconfirmed.setdefault(finding.key, context)
            if finding.key not in self.confirmed and opinfo not in self.recheck:
                self.recheck.append(opinfo)

    def count(self, ref: Reference) -> None:
        for ptr, depends in ref.read.items():
            verdict = ("written" if ptr in ref.written else "moved" if ptr in ref.moved
                       else {True: "read", False: "not read", None: "read unknown"}[depends])
            self.verdicts[verdict] = self.verdicts.get(verdict, 0) + 1
        self.verdicts["fresh"] = self.verdicts.get("fresh", 0) + len(ref.fresh)

    def unsettled_ops(self) -> set:
        """Overloads with an unconfirmed over-approximation: analysed past the cap."""
        return {key.split(":")[0] for key in self.unconfirmed if key not in self.confirmed}

    def disagreements(self) -> dict:
        """Key -> the OpInfo sample that first showed it."""
        over = {key: where for key, where in self.unconfirmed.items() if key not in self.confirmed}
        return dict(sorted({**self.misses, **over}.items()))

    def summary(self) -> str:
        verdicts = ", ".join(f"{count} {verdict}" for verdict, count in sorted(self.verdicts.items()))
        lines = [(f"{self.opinfos} OpInfos, {self.samples} sample calls, {len(self.seen)} aten overloads seen, "
                  f"{len(self.analyses)} analysed in {sum(self.analyses.values())} calls, in {self.seconds:.0f} s; "
                  f"storages: {verdicts}; {len(self.unanalysable)} overloads with calls that cannot run on "
                  f"copies; {len(self.disagreements())} disagreements")]
        lines += [f"  {key}    (first in {where})" for key, where in self.disagreements().items()]
        lines += [f"  reference error: {error}" for error in self.errors]
        return "\n".join(lines)


def _dtype_for(opinfo) -> Optional[torch.dtype]:
    supported = opinfo.supported_dtypes("cpu")
    for dtype in (torch.float32, torch.int64, torch.complex64, torch.bool, torch.float64):
        if dtype in supported:
            return dtype
    return next(iter(supported), None)


def _variants(opinfo, sample, index: int) -> list:
    """(label, call) per variant of the op to run on ``sample``: the
    function, the in-place method on a copy of its input, ``out=`` tensors
    of the result's size, and (first sample only) ``out=`` empty tensors,
    which the kernel resizes."""
    variants = [("", lambda: opinfo.op(sample.input, *sample.args, **sample.kwargs))]
    if opinfo.inplace_variant is not None and isinstance(sample.input, torch.Tensor):
        own = sample.input.clone()
        variants.append(("inplace", lambda: opinfo.inplace_variant(own, *sample.args, **sample.kwargs)))
    expected = _result(opinfo, sample) if opinfo.supports_out else None
    if expected is not None:
        variants.append(("out", lambda: _with_out(opinfo, sample, expected, torch.zeros_like)))
        if index == 0:
            variants.append(("out=empty", lambda: _with_out(opinfo, sample, expected, _empty_of)))
    return variants


def _result(opinfo, sample):
    """The op's result on ``sample`` (outside the Observer), for its
    ``out=`` tensors; None if it raises."""
    try:
        return opinfo.op(sample.input, *sample.args, **sample.kwargs)
    except Exception:  # a sample only some variant accepts
        return None


def _empty_of(t: torch.Tensor) -> torch.Tensor:
    return torch.empty(0, dtype=t.dtype)


def _with_out(opinfo, sample, expected, make):
    if isinstance(expected, torch.Tensor):
        out = make(expected)
    elif isinstance(expected, (tuple, list)) and all(isinstance(t, torch.Tensor) for t in expected):
        out = tuple(make(t) for t in expected)
    else:
        return None
    return opinfo.op(sample.input, *sample.args, **sample.kwargs, out=out)


def survey_op_db(samples_per_op: int = 2, names: Optional[set] = None, opinfos: Optional[list] = None) -> Survey:
    """Runs up to ``samples_per_op`` samples of every OpInfo of ``op_db``
    (CPU, float32 where supported) under the Observer."""
    if opinfos is None:
        from torch.testing._internal.common_methods_invocations import op_db as opinfos
    survey = Survey()
    started = time.perf_counter()
    rng = torch.random.get_rng_state()
    with warnings.catch_warnings(), _no_test_lookup():
        warnings.simplefilter("ignore")  # deprecations and betas of the ops sampled
        for opinfo in opinfos:
            if names is not None and opinfo.name not in names:
                continue
            if _survey_opinfo(survey, opinfo, range(samples_per_op)):
                survey.opinfos += 1
        for opinfo in list(survey.recheck):  # a read or write one sample does not show, another may
            _survey_opinfo(survey, opinfo, range(samples_per_op, samples_per_op + MORE_SAMPLES))
    torch.random.set_rng_state(rng)
    survey.seconds = time.perf_counter() - started
    return survey


@contextlib.contextmanager
def _no_test_lookup():
    """Each sample generator looks for the unittest test running it with
    inspect.stack() (to name its seed after it): 0.1 s a generator under
    pytest.  There is none here: the generators take torch's default seed."""
    from torch.testing._internal import common_utils
    from torch.testing._internal.opinfo import core

    modules = (common_utils, core)  # core imported the name
    lookups = [module.extract_test_fn for module in modules]
    for module in modules:
        module.extract_test_fn = lambda: None
    try:
        yield
    finally:
        for module, lookup in zip(modules, lookups):
            module.extract_test_fn = lookup


def _survey_opinfo(survey: Survey, opinfo, indices: range) -> bool:
    dtype = _dtype_for(opinfo)
    if dtype is None:
        return False
    name = opinfo.name + (f".{opinfo.variant_test_name}" if opinfo.variant_test_name else "")
    ran = False
    torch.default_generator.manual_seed(SEED)  # the samples' random values: the same every run
    try:
        samples = opinfo.sample_inputs("cpu", dtype, requires_grad=False)
        for index, sample in zip(range(indices.stop), samples):
            if index < indices.start:
                continue
            for label, call in _variants(opinfo, sample, index):
                ran |= _run_variant(survey, opinfo, call, f"{name}{'/' + label if label else ''} sample {index}")
    except Exception:  # a sample generator that fails on this build: nothing to check
        pass
    return ran


def _run_variant(survey: Survey, opinfo, call, context: str) -> bool:
    try:
        with Observer(survey, opinfo, context):
            call()
    except Exception:  # an OpInfo sample a variant does not accept (in-place on a broadcast input...)
        return False
    survey.samples += 1
    return True


if __name__ == "__main__":
    import sys

    chosen = set(sys.argv[1:]) or None
    print(survey_op_db(names=chosen).summary())
