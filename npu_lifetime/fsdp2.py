"""Runs torch's own FSDP2 (``fully_shard``) with its hand-rolled stream
hand-offs replaced by ``record_use`` and a plain ``del``.

FSDP2 hands three buffers from the stream that allocated them to another
stream that reads them last, each with the same recipe: record an event
after the last read, keep the buffer alive in a stash, and later make the
allocating stream wait on the event before dropping the stash.

* all-gather output: allocated on the all-gather copy-in stream, last read
  on the current stream by the copy-out.  Recipe: an event after the
  copy-out, the buffer stashed in ``comm_ctx.all_gather_state`` until the
  next group (forward), else the all-gather streams wait on it at once.
  Migrated: ``record_use(output)`` after the copy-out; dropped at once.
* reduce-scatter input: allocated on the current stream, last read on the
  reduce-scatter stream by the collective.  Recipe: an event, the buffer
  stashed in ``comm_ctx.reduce_scatter_state(s)`` until a later
  post-backward or the end of backward waits on it.  Migrated:
  ``record_use(input, reduce_scatter_stream)``; dropped at once.
* all-reduce input (HSDP): allocated on the reduce-scatter stream, last
  read on the all-reduce stream.  Recipe: an event, kept in
  ``_all_reduce_state`` until the next post-backward waits on it.
  Migrated: ``record_use(input, all_reduce_stream)``; dropped at once.

How, without copying FSDP2's code: the module globals of
``_fsdp_param_group`` that FSDP2 calls (``foreach_all_gather_copy_out``,
``foreach_reduce``; torch's own tests patch the latter the same way) are
wrapped to add the ``record_use`` after the last read; the three stash
constructors (``AllGatherState``, ``ReduceScatterState``,
``AllReduceState``) return an empty stash, so every reader finds nothing to
wait on; and the wait of the all-gather streams on the copy-out event is
skipped inside ``wait_for_unshard``.  The events FSDP2 still records there
are never waited on.  Every function whose behaviour this relies on is
fingerprinted (its source's hash) per torch version; another version is
refused with the functions that differ.

    with npu_lifetime.fsdp2.use_record_use():
        loss = model(x).sum(); loss.backward(); optim.step()

Under the shim (``npu_lifetime.install``) each ``record_use`` is an event on
the allocator block; under the native caching allocator it is the fallback
(event + owned reference).  On a CPU device there is nothing to hold: the
hand-offs are only counted.
"""
from __future__ import annotations

import contextlib
import hashlib
import inspect
import threading
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

# Modes: the migration, FSDP2 unchanged, and two broken migrations kept to
# show what the sanitizer and memory pressure make of them.
RECIPE = "recipe"
RECORD_USE = "record_use"
BROKEN_NO_RECORD_USE = "broken: dropped without record_use"
BROKEN_RECORD_USE_EARLY = "broken: record_use before the last read"
MODES = (RECIPE, RECORD_USE, BROKEN_NO_RECORD_USE, BROKEN_RECORD_USE_EARLY)

KINDS = ("all_gather_output", "reduce_scatter_input", "all_reduce_input")


class FSDP2VersionError(RuntimeError):
    pass


# -- what each known FSDP2 looks like ----------------------------------------------------------------
# Fingerprinted: every function of FSDP2's runtime modules that names a stash
# (found by reading the installed sources), the functions wrapped below, and
# the stash types.  A version is known when the set and every hash match.
_STASH_NAMES = {"all_gather_state", "reduce_scatter_state", "reduce_scatter_states", "_all_reduce_state",
                "AllGatherState", "ReduceScatterState", "AllReduceState"}
_ALWAYS = ("_fsdp_param_group:FSDPParamGroup._wait_all_gather_streams_on_event",
           "_fsdp_collectives:foreach_all_gather", "_fsdp_collectives:foreach_all_gather_copy_out",
           "_fsdp_collectives:foreach_reduce", "_fsdp_param_group:AllGatherState",
           "_fsdp_param_group:ReduceScatterState", "_fsdp_param_group:AllReduceState")


@dataclass(frozen=True)
class _Profile:
    """What differs between the FSDP2 versions the migration knows."""

    torch_version: str
    fingerprints: dict
    all_reduce_input_index: int  # in foreach_reduce's result
    empty_reduce_scatter_state: Callable  # the stash type -> what its constructor returns instead


def _no_stash(*args, **kwargs):
    return None


def _empty_stash_of(cls):
    return lambda *args, **kwargs: cls(*(None for _ in cls._fields))


_PROFILES = (
    _Profile("2.11", {
        "_fsdp_collectives:foreach_all_gather": "1aa050738aa76be3",
        "_fsdp_collectives:foreach_all_gather_copy_out": "c0f79256258369b3",
        "_fsdp_collectives:foreach_reduce": "46bcdaa0df40823e",
        "_fsdp_param_group:AllGatherState": "64e557d5685bf826",
        "_fsdp_param_group:AllReduceState": "93b1d6ec4e07f556",
        "_fsdp_param_group:FSDPCommContext.lazy_init": "9bbf06ea7a274ed1",
        "_fsdp_param_group:FSDPParamGroup.__init__": "323868f31033bb56",
        "_fsdp_param_group:FSDPParamGroup._wait_all_gather_streams_on_event": "06ed01f868dd9dbe",
        "_fsdp_param_group:FSDPParamGroup._wait_for_post_backward": "0251255a6872e30c",
        "_fsdp_param_group:FSDPParamGroup.post_backward": "db4367af6f37c6aa",
        "_fsdp_param_group:FSDPParamGroup.wait_for_unshard": "92c196c60683a329",
        "_fsdp_param_group:ReduceScatterState": "0f08f6b22a03c1ba",
        "_fsdp_state:FSDPState._post_forward": "a406f0944b6bda65",
        "_fsdp_state:FSDPState._root_post_backward_final_callback": "7186ca3d063cb1fb",
    }, all_reduce_input_index=3, empty_reduce_scatter_state=lambda cls: _no_stash),
    _Profile("2.13", {
        "_fsdp_collectives:foreach_all_gather": "1aa050738aa76be3",
        "_fsdp_collectives:foreach_all_gather_copy_out": "9cff16b1c5fd8d8d",
        "_fsdp_collectives:foreach_reduce": "cc2a17ca7325d89e",
        "_fsdp_param_group:AllGatherState": "64e557d5685bf826",
        "_fsdp_param_group:AllReduceState": "1e974a3571f0adb5",
        "_fsdp_param_group:FSDPCommContext.lazy_init": "e2ae0320fb0499ea",
        "_fsdp_param_group:FSDPParamGroup.__init__": "5904f00326c38f01",
        "_fsdp_param_group:FSDPParamGroup._reset_iter_state": "f0cd338bb447bbed",
        "_fsdp_param_group:FSDPParamGroup._wait_all_gather_streams_on_event": "06ed01f868dd9dbe",
        "_fsdp_param_group:FSDPParamGroup._wait_for_post_backward": "0251255a6872e30c",
        "_fsdp_param_group:FSDPParamGroup.finalize_backward": "43e9475a329d4f9d",
        "_fsdp_param_group:FSDPParamGroup.post_backward": "3c8bf9dee0f55861",
        "_fsdp_param_group:FSDPParamGroup.wait_for_unshard": "d8a22e680d60d77c",
        "_fsdp_param_group:ReduceScatterState": "0f08f6b22a03c1ba",
        "_fsdp_state:FSDPState._post_forward": "dcdee0e958fa8fa2",
        "_fsdp_state:FSDPState._reset_iter_state": "cb07b709a93fc839",
        "_fsdp_state:FSDPState._root_post_backward_final_callback": "6e9105e634bf43a6",
    }, all_reduce_input_index=4, empty_reduce_scatter_state=_empty_stash_of),
)


def _modules() -> dict:
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives, _fsdp_param_group, _fsdp_state

    return {"_fsdp_param_group": _fsdp_param_group, "_fsdp_state": _fsdp_state,
            "_fsdp_collectives": _fsdp_collectives}


def _stash_users(modules: dict) -> set:
    """"module:Class.function" for every function that names a stash."""
    import ast

    users = set()
    for module_name, module in modules.items():
        tree = ast.parse(inspect.getsource(module))
        scopes = [("", tree)] + [(f"{n.name}.", n) for n in tree.body if isinstance(n, ast.ClassDef)]
        for prefix, scope in scopes:
            for fn in scope.body:
                if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    names = {n.attr for n in ast.walk(fn) if isinstance(n, ast.Attribute)}
                    names |= {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)}
                    if names & _STASH_NAMES:
                        users.add(f"{module_name}:{prefix}{fn.name}")
    return users


def fingerprints() -> dict:
    """{"module:qualified name": hash of its source} for every function and
    type the migration relies on, in the installed torch."""
    modules = _modules()
    out = {}
    for key in sorted(_stash_users(modules) | set(_ALWAYS)):
        module_name, qualname = key.split(":")
        obj = modules[module_name]
        for part in qualname.split("."):
            obj = getattr(obj, part)
        source = inspect.getsource(inspect.unwrap(obj))
        out[key] = hashlib.sha256(source.encode()).hexdigest()[:16]
    return out


def check_version() -> _Profile:
    """The profile of the installed FSDP2, or FSDP2VersionError naming what
    differs from every version the migration was verified against."""
    try:
        found = fingerprints()
    except (ImportError, AttributeError, OSError, TypeError) as err:
        raise FSDP2VersionError(
            f"torch {torch.__version__}: cannot read FSDP2's sources ({err}); the record_use migration "
            f"supports the FSDP2 of torch {', '.join(p.torch_version for p in _PROFILES)}"
        ) from err
    for profile in _PROFILES:
        if profile.fingerprints == found:
            return profile
    closest = min(_PROFILES, key=lambda p: len(_differences(p.fingerprints, found)))
    differ = _differences(closest.fingerprints, found)
    raise FSDP2VersionError(
        f"torch {torch.__version__}: this FSDP2 differs from the versions the record_use migration knows "
        f"({', '.join('torch ' + p.torch_version for p in _PROFILES)}); closest is torch {closest.torch_version}, "
        f"which differs in {', '.join(differ)}. Run FSDP2 unmigrated, or verify these functions' hand-offs "
        "and add a profile to npu_lifetime/fsdp2.py"
    )


def _differences(known: dict, found: dict) -> list:
    return sorted(k.split(":")[1] for k in set(known) | set(found) if known.get(k) != found.get(k))


# -- the migration ------------------------------------------------------------------------------------------
@dataclass
class Instrument:
    """Hooks for demonstrations and tests (slow consumers, memory
    pressure); they see sizes and streams, never keep a buffer alive."""

    before_last_read: Optional[Callable] = None  # (kind, consumer stream), before the last read is queued
    after_drop: Optional[Callable] = None  # (kind, nbytes, address, device, producer stream), once FSDP2 let go

    def __post_init__(self) -> None:
        for name in ("before_last_read", "after_drop"):
            hook = getattr(self, name)
            if hook is not None and not callable(hook):
                raise TypeError(f"Instrument.{name} must be a function or None, not {type(hook).__name__} {hook!r}")


@dataclass
class Handoffs:
    """The patches for one ``mode`` (see ``MODES``).  ``counts``: hand-offs
    seen per kind; ``record_use_calls``: those sent to record_use;
    ``stashed``: how often FSDP2 still held the buffer in a stash after the
    hand-off (the recipe; never when migrated)."""

    mode: str = RECORD_USE
    instrument: Instrument = field(default_factory=Instrument)
    counts: dict = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    record_use_calls: dict = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    stashed: dict = field(default_factory=lambda: dict.fromkeys(KINDS, 0))  # kept alive by FSDP2 past a hand-off
    waits_skipped: int = 0  # all-gather streams not made to wait on a copy-out event

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {self.mode!r}")
        if not isinstance(self.instrument, Instrument):
            raise TypeError(f"instrument must be an npu_lifetime.fsdp2.Instrument, not "
                            f"{type(self.instrument).__name__} {self.instrument!r}")
        if _active is not None:
            raise RuntimeError(_already_patched())
        self.profile = check_version()
        self._tls = threading.local()
        self._saved: list = []

    @property
    def migrated(self) -> bool:
        return self.mode != RECIPE

    # -- hand-offs (these run on FSDP2's hot path: only what the hand-off needs) -------------------------
    def _hand_off(self, kind: str, tensor: torch.Tensor, stream=None) -> None:
        if tensor.device.type == "cpu":
            return  # host memory: no stream to outlive
        from .recording import record_use

        record_use(tensor, stream)
        self.record_use_calls[kind] += 1

    def _copy_out(self, original: Callable) -> Callable:
        def foreach_all_gather_copy_out(all_gather_result, *args, **kwargs):
            output = all_gather_result.all_gather_output
            self.counts["all_gather_output"] += 1
            if self.mode == BROKEN_RECORD_USE_EARLY:
                self._hand_off("all_gather_output", output)
            self._before_last_read("all_gather_output", output.device)
            original(all_gather_result, *args, **kwargs)
            if self.mode == RECORD_USE:
                self._hand_off("all_gather_output", output)

        return foreach_all_gather_copy_out

    def _reduce(self, original: Callable) -> Callable:
        ar_index = self.profile.all_reduce_input_index
        argument = _argument_getter(original)  # positions looked up once: this runs on every reduce-scatter
        instrumented = self.instrument.before_last_read is not None or self.instrument.after_drop is not None

        def foreach_reduce(*args, **kwargs):
            rs_stream, ar_stream = argument("reduce_scatter_stream", args, kwargs), argument("all_reduce_stream", args,
                                                                                             kwargs)
            device = argument("device", args, kwargs)
            if self.instrument.before_last_read is not None and device.type != "cpu":
                with _device_module(device).stream(rs_stream):
                    self.instrument.before_last_read("reduce_scatter_input", rs_stream)
            if instrumented:
                self._tls.rs_producer = _device_module(device).current_stream() if device.type != "cpu" else None
            result = original(*args, **kwargs)
            rs_input, ar_input = result[0], result[ar_index]
            self.counts["reduce_scatter_input"] += 1
            if instrumented:
                self._tls.rs_dropped = (rs_input.untyped_storage().nbytes(), rs_input.data_ptr(), rs_input.device)
            if self.migrated and self.mode != BROKEN_NO_RECORD_USE:
                self._hand_off("reduce_scatter_input", rs_input, rs_stream)
            if ar_input is not None:
                self.counts["all_reduce_input"] += 1
                if self.migrated and self.mode != BROKEN_NO_RECORD_USE:
                    self._hand_off("all_reduce_input", ar_input, ar_stream)
            del rs_input, ar_input
            return result

        return foreach_reduce

    def _wait_for_unshard(self, original: Callable) -> Callable:
        def wait_for_unshard(group):
            dropped = self._all_gather_output_of(group)
            self._tls.in_unshard = self.migrated
            try:
                original(group)
            finally:
                self._tls.in_unshard = False
            self.stashed["all_gather_output"] += getattr(group.comm_ctx, "all_gather_state", None) is not None
            if dropped is not None:
                self._after_drop("all_gather_output", *dropped)

        return wait_for_unshard

    def _all_gather_output_of(self, group) -> Optional[tuple]:
        """What the pressure hook needs of the output about to be handed
        off: size, address, device, producer stream (never the tensor)."""
        result = group._all_gather_result
        if result is None or self.instrument.after_drop is None:
            return None
        output = result.all_gather_output
        if output.numel() == 0 or output.device.type == "cpu":
            return None
        producer = (group.comm_ctx.all_gather_copy_in_stream if result.all_gather_work is None
                    else _device_module(output.device).current_stream())
        return output.untyped_storage().nbytes(), output.data_ptr(), output.device, producer

    def _wait_all_gather_streams(self, original: Callable) -> Callable:
        def _wait_all_gather_streams_on_event(group, event):
            if getattr(self._tls, "in_unshard", False):
                self.waits_skipped += event is not None
                return  # the copy-out hand-off: record_use took its place
            original(group, event)

        return _wait_all_gather_streams_on_event

    def _post_backward(self, original: Callable) -> Callable:
        def post_backward(group, *args):
            self._tls.rs_dropped = None
            out = original(group, *args)
            self._count_stashes(group)
            dropped, self._tls.rs_dropped = getattr(self._tls, "rs_dropped", None), None
            producer = getattr(self._tls, "rs_producer", None)
            if dropped is not None and producer is not None:
                self._after_drop("reduce_scatter_input", *dropped, producer)
            return out

        return post_backward

    def _count_stashes(self, group) -> None:
        ctx = group.comm_ctx
        states = getattr(ctx, "reduce_scatter_states", None)  # torch 2.13: a list
        if states is None:
            states = [ctx.reduce_scatter_state] if getattr(ctx, "reduce_scatter_state", None) is not None else []
        self.stashed["reduce_scatter_input"] += sum(s.reduce_scatter_input is not None for s in states)
        self.stashed["all_reduce_input"] += getattr(group, "_all_reduce_state", None) is not None

    def _before_last_read(self, kind: str, device: torch.device) -> None:
        if self.instrument.before_last_read is not None and device.type != "cpu":
            self.instrument.before_last_read(kind, _device_module(device).current_stream())

    def _after_drop(self, kind: str, nbytes: int, address: int, device, producer) -> None:
        if self.instrument.after_drop is not None:
            self.instrument.after_drop(kind, nbytes, address, device, producer)

    # -- patching ---------------------------------------------------------------------------------------
    def enable(self) -> "Handoffs":
        global _active
        if self._saved:
            return self
        if _active is not None:
            raise RuntimeError(_already_patched())
        modules = _modules()
        group_module = modules["_fsdp_param_group"]
        group_class = group_module.FSDPParamGroup
        patches = [
            (group_module, "foreach_all_gather_copy_out", self._copy_out),
            (group_module, "foreach_reduce", self._reduce),
            (group_class, "wait_for_unshard", self._wait_for_unshard),
            (group_class, "post_backward", self._post_backward),
        ]
        if self.migrated:
            patches += [
                (group_class, "_wait_all_gather_streams_on_event", self._wait_all_gather_streams),
                (group_module, "AllGatherState", lambda cls: _no_stash),
                (group_module, "ReduceScatterState", self.profile.empty_reduce_scatter_state),
                (group_module, "AllReduceState", lambda cls: _no_stash),
            ]
        for owner, name, make in patches:
            original = vars(owner)[name]
            self._saved.append((owner, name, original))
            setattr(owner, name, make(original))
        _active = self
        return self

    def disable(self) -> None:
        global _active
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)
        if self._saved:
            _active = None
        self._saved.clear()

    def __enter__(self) -> "Handoffs":
        return self.enable()

    def __exit__(self, *exc) -> None:
        self.disable()


_active: Optional[Handoffs] = None


def _already_patched() -> str:
    return (f"FSDP2's hand-offs are already patched (mode {_active.mode!r}, by another Handoffs or "
            "use_record_use block): leave that block, or call its disable(), first")


def _device_module(device):
    device_type = device.type if isinstance(device, torch.device) else device
    if device_type == "npu":
        import torch_npu  # noqa: F401

    return getattr(torch, device_type)


def _argument_getter(function: Callable) -> Callable:
    """``get(name, args, kwargs)``: an argument of a call to ``function`` by
    name, with its position found once (``inspect.signature.bind`` on
    every call costs microseconds)."""
    positions = {name: i for i, name in enumerate(inspect.signature(function).parameters)}

    def get(name: str, args: tuple, kwargs: dict):
        i = positions[name]
        return args[i] if i < len(args) else kwargs[name]

    return get


@contextlib.contextmanager
def use_record_use(instrument: Optional[Instrument] = None):
    """FSDP2's hand-offs by ``record_use`` inside the block (see module doc)."""
    with Handoffs(RECORD_USE, Instrument() if instrument is None else instrument) as handoffs:
        yield handoffs
