"""One TorchDispatchMode for every enabled sanitizer.

Each op is seen once: its site captured once, its accesses derived once per
device backend (``accesses.py``), the device events it issues while it runs
held by its frame (``hub.py``), and then the whole op is replayed into every
enabled sanitizer of the backend in device order: the op's in-op events with
its accesses put in place (``lifetime.op_order``), on the stream the op runs
on (the current stream; the source device's for a cross-device copy; a
collective's own stream).

The mode is entered when the first sanitizer is enabled and left when the
last one is disabled, if it is still the innermost mode of the thread;
otherwise (a mode entered after it is still active) it stays, dormant, and is
reused by the next sanitizer.  Enabling and disabling sanitizers in any order
therefore never pops another mode off the stack.
"""
from __future__ import annotations

import sys
import threading
from typing import Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

from ..lifetime.op_order import HOST_SYNC, OTHER, RECORD, WAIT, access_point, first_waiter, output_point
from ..recording import watchers  # (the package defines the op npu_lifetime::record_use)
from . import accesses, collectives
from .hub import on_thread

_lock = threading.Lock()
_active: tuple = ()  # enabled sanitizers (replaced, never mutated)
_backends: tuple = ()  # their distinct backends
_op_hooked: tuple = ()  # those with before_op / inside_op hooks (the simulated device)
_depth = 8  # user frames per site: the most any enabled sanitizer asked for
_mode: Optional["_Mode"] = None
_fast_path = None  # the C dispatch (Parts.dispatch) a mode was bound to, once one was: its common op's state
_armed: dict = {}  # the followers (Parts.running_threads) that armed running threads, until the last disable

_KINDS = {
    "on_event_record": lambda args: (RECORD, args[1]),
    "on_event_wait": lambda args: (WAIT, args[1]),
    "on_event_sync": lambda args: (HOST_SYNC, None),
    "on_stream_sync": lambda args: (HOST_SYNC, None),
    "on_device_sync": lambda args: (HOST_SYNC, None),
}


def active() -> tuple:
    return _active


def activate(sanitizer) -> None:
    """Enables ``sanitizer``; a new mode takes its parts' dispatch (C's
    fast path, or the Python body alone)."""
    global _mode, _fast_path
    parts = sanitizer.parts
    with _lock:
        if parts.dispatch is not None:
            _fast_path = parts.dispatch
        if sanitizer not in _active:
            _set_active((*_active, sanitizer))
        if _mode is None or _mode not in _get_current_dispatch_mode_stack():
            _mode = _Mode(parts.dispatch)
            _mode.__enter__()
        _armed[parts.running_threads] = True
        parts.running_threads.follow_running(follow_this_thread)


def follow_this_thread() -> None:
    """While a sanitizer is enabled, the calling thread's ops reach the mode
    (torch keeps a dispatch-mode stack per thread: ``threads.py``)."""
    mode = _mode
    if mode is None or not _active:
        return
    if any(isinstance(m, _Mode) for m in _get_current_dispatch_mode_stack()):
        return
    torch._C._push_on_torch_dispatch_stack(mode)


def deactivate(sanitizer) -> None:
    global _mode
    with _lock:
        rest = tuple(s for s in _active if s is not sanitizer)
        try:
            _set_active(rest)
        except Exception:  # the C path's state for the rest failed: their ops take the Python body
            _set_active(rest, fast_path=False)
        stack = _get_current_dispatch_mode_stack()
        if not _active:
            for follower in _armed:
                follower.stop_following()
            _armed.clear()
        if not _active and _mode is not None and stack and stack[-1] is _mode:
            _mode.__exit__(None, None, None)
            _mode = None


def _set_active(sanitizers: tuple, fast_path: bool = True) -> None:
    """Makes ``sanitizers`` the enabled ones; all or nothing (what can fail comes first)."""
    global _active, _backends, _depth, _op_hooked
    state = _fast_path_state(sanitizers) if fast_path and _fast_path is not None else None
    by_type: dict = {}
    for s in sanitizers:
        by_type.setdefault(s.backend.device_type, ())
        by_type[s.backend.device_type] += (s,)
    _backends = tuple(dict.fromkeys(s.backend for s in sanitizers))
    _op_hooked = tuple(b for b in _backends if b.hooks_ops)
    _depth = max((s.stack_depth for s in sanitizers), default=8)
    watchers.publish(by_type)  # record_use, record_stream, erase_stream reach these sanitizers from there
    _active = sanitizers
    if _fast_path is not None:
        _fast_path.common(state)


def _lifetime_ops() -> tuple:
    return (torch.ops.aten.record_stream.default, torch.ops.npu_lifetime.record_use.default)


class _Mode(TorchDispatchMode):
    def __init__(self, fast_path=None) -> None:
        super().__init__()
        self._lifetime = _lifetime_ops()
        if fast_path is not None:
            # __torch_dispatch__ in C (Parts.dispatch), bound to this mode once, when it is made: the
            # common op there, every other op the body below, without torch's Dynamo-disabling wrapper
            # unless Dynamo is active on the thread
            self.__torch_dispatch__ = fast_path.dispatcher(self)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        sanitizers = _active
        if not sanitizers:
            return func(*args, **kwargs)
        if func is self._lifetime[0] or func is self._lifetime[1]:
            for s in sanitizers:
                s.lifetime_op(func, args, kwargs)
            return func(*args, **kwargs)
        for backend in _op_hooked:
            backend.before_op()  # the simulated device: autograd's streams (the op's stream, its waits)
        plan = accesses.plan(func)
        if not plan.touches_data:
            if plan.resizes:
                return _resize(func, args, kwargs, sanitizers)
            return func(*args, **kwargs)
        parts = sanitizers[0].parts  # the first sanitizer's walk and scan (each takes the other's entries)
        scan = parts.scan
        frame = parts.op_frame(parts.capture(_depth, 0))
        written_before = accesses.written_storages(plan, args, kwargs, scan) if plan.writes else None
        outer, on_thread.frame = on_thread.frame, frame
        try:
            outputs = func(*args, **kwargs)
            for backend in _op_hooked:
                backend.inside_op(func, args)
        except BaseException:
            on_thread.frame = outer
            _replay_held(frame)  # what the op did issue still happened
            raise
        on_thread.frame = outer
        if frame.held or plan.collective or len(sanitizers) > 1:
            error = _feed(func, plan, args, kwargs, outputs, frame, sanitizers, written_before)
            if error is not None:
                raise error
            return outputs
        # the common op (one sanitizer, no in-op event, no collective): its accesses on the current stream
        sanitizer = sanitizers[0]
        backend = sanitizer.backend
        found = accesses.op_accesses(func, args, kwargs, outputs, backend.tracks, plan, written_before, scan)
        if not found:
            return outputs
        device = found[0].device_index
        for a in found:
            if a.device_index != device:
                device = _op_device(backend, found)
                break
        current = backend.current_stream(device)
        try:
            error = sanitizer.apply_accesses(current, found, frame.site, plan.name)
        except Exception as raised:  # a warning turned into an error
            error = raised
        if error is not None:
            raise error
        return outputs


# the C path's guards: a test that replaces one of these gets the body
_OP_ACCESSES, _PLAN, _WRITTEN_STORAGES = accesses.op_accesses, accesses.plan, accesses.written_storages


def _fast_path_state(sanitizers: tuple):
    """What _dispatch.c needs to run the common op as the body does: its
    ``OpFeed``, each field named (documented there), or None: every op to
    the body.  The guards send ops to the body while a test replaces a
    function of the scan."""
    if len(sanitizers) != 1 or sanitizers[0].parts.dispatch is not _fast_path:
        return None
    return _fast_path.OpFeed(**_op_feed_fields(sanitizers))


def _op_feed_fields(sanitizers: tuple) -> dict:
    """The OpFeed's fields for the one enabled sanitizer, by name."""
    sanitizer = sanitizers[0]
    backend, parts = sanitizer.backend, sanitizer.parts
    hooked = (backend,) if backend.hooks_ops else ()

    def feed_held(func, plan, args, kwargs, outputs, frame, written_before):
        return _feed(func, plan, args, kwargs, outputs, frame, sanitizers, written_before)

    guards = ((vars(accesses), "op_accesses", _OP_ACCESSES), (vars(accesses), "plan", _PLAN),
              (vars(accesses), "written_storages", _WRITTEN_STORAGES))
    return dict(
        sanitizer=sanitizer, backend=backend, tracked=backend.tracks, op_device=_op_device,
        before_op=tuple(b.before_op for b in hooked), inside_op=tuple(b.inside_op for b in hooked),
        depth=sanitizer.stack_depth, capture=parts.capture, op_frame=parts.op_frame, on_thread=on_thread,
        replay_held=_replay_held, feed_held=feed_held, written_storages=parts.scan.written, scan_op=parts.scan.op,
        plan=_PLAN, lifetime_ops=_lifetime_ops(), guards=guards, stream_handle=backend.stream_handle,
        **_apply_parts(sanitizer), binding=_op_binding, forwarder=_op_forwarder())


def _forwarding_call(self, /, *args, **kwargs):
    return self._op(*args, **kwargs)


def _only_forwards(call) -> bool:
    """``call`` is torch's ``OpOverload.__call__`` as it is written today:
    ``return self._op(*args, **kwargs)`` and nothing else (the same
    bytecode and names as ``_forwarding_call``, compiled by this
    interpreter)."""
    code, mine = getattr(call, "__code__", None), _forwarding_call.__code__
    return code is not None and (code.co_code, code.co_names, code.co_varnames) == (
        mine.co_code, mine.co_names, mine.co_varnames)


def _op_forwarder():
    """``OpOverload.__call__`` when it only forwards to the op's C++ binding,
    else None.  _dispatch.c compares it with the class's ``__call__`` before
    each op it runs by the binding: a ``__call__`` patched later is run."""
    call = getattr(torch._ops.OpOverload, "__call__", None)
    return call if _only_forwards(call) else None


def _op_binding(func):
    """What runs ``func``: its C++ binding where ``func`` is an
    ``OpOverload`` whose ``__call__`` only forwards to it (torch's
    ``return self._op(*args, **kwargs)``), which saves that Python frame on
    every op; else ``func`` itself."""
    if type(func) is torch._ops.OpOverload and _op_forwarder() is not None and callable(getattr(func, "_op", None)):
        return func._op
    return func


def _apply_parts(sanitizer) -> dict:
    """What LifetimeSanitizer.apply_accesses reads, for _dispatch.c's copy of it (OpFeed fields)."""
    model, storages = sanitizer.model, sanitizer.storages
    return dict(lock=sanitizer._lock, has_stream=model.has_stream, feed=sanitizer._op_feed, live=storages.live,
                sizeless=storages.sizeless, first_sight=sanitizer._first_sight, set_size=model.set_size,
                access=model.access, findings_add=sanitizer._findings.add, announce=sanitizer._announce_races)


def _resize(func, args, kwargs, sanitizers: tuple):
    """``resize_`` / ``resize_as_``: shape only, unless the storage grows;
    then the old bytes are read (before the op: on a device the old block is
    freed inside it), copied into a new block (a fresh storage written after
    the op) and the old block freed (seen by the device's allocation trace,
    or here on the simulated device)."""
    growing = {}
    for backend in _backends:
        t = accesses.growing_storage(func, args, backend.tracks)
        if t is not None:
            growing[backend] = (t, t.untyped_storage().data_ptr())
    if not growing:
        return func(*args, **kwargs)
    parts = sanitizers[0].parts
    frame = parts.op_frame(parts.capture(_depth, 1))
    op_name = func._schema.name
    error = None

    def feed(backend, found):
        nonlocal error
        if found:
            current = backend.current_stream(found[0].device_index)
            for s in sanitizers:
                if s.backend is backend:
                    error = s.apply_op((("accesses", (current, found, current)),), frame.site, op_name) or error

    for backend, (t, before) in growing.items():
        feed(backend, accesses.resize_accesses(t, before, write=False))
    outer, on_thread.frame = on_thread.frame, frame
    try:
        outputs = func(*args, **kwargs)
    finally:
        on_thread.frame = outer
        _replay_held(frame)
    for backend, (t, before) in growing.items():
        if t.untyped_storage().data_ptr() == before:
            continue
        for s in sanitizers:
            if s.backend is backend:
                s.storage_moved(before, frame.site)
        feed(backend, accesses.resize_accesses(t, before, write=True))
    if error is not None:
        raise error
    return outputs


def _replay_held(frame) -> None:
    for hub, name, args in frame.held:
        hub.deliver(name, args)


def _feed(func, plan, args, kwargs, outputs, frame, sanitizers: tuple, written_before=None):
    """Replays the op into each sanitizer; returns the first error one of
    them wants raised (a data race under ``on_race="raise"``)."""
    error = None
    op_name = plan.name
    scan = sanitizers[0].parts.scan
    for backend in _backends:
        found = accesses.op_accesses(func, args, kwargs, outputs, backend.tracks, plan, written_before, scan)
        events = [(name, a) for hub, name, a in frame.held if hub is backend.hub] if frame.held else ()
        if not found and not events:
            continue
        if events or plan.collective:
            feed = _in_device_order(backend, func, plan, args, kwargs, outputs, found, events)
        else:  # the common case: the op's accesses on the current stream
            current = backend.current_stream(_op_device(backend, found))
            feed = (("accesses", (current, found, current)),)
        for s in sanitizers:
            if s.backend is backend:
                try:
                    error = s.apply_op(feed, frame.site, op_name) or error
                except Exception as raised:  # a warning turned into an error: the others still see the op
                    error = error or raised
    return error


def _op_device(backend, found: list) -> int:
    """A copy between two devices runs on the source device's stream."""
    if not found:
        return backend.current_device()
    device = found[0].device_index
    for a in found:
        if a.device_index != device:
            return next((a for a in found if not a.is_write), found[0]).device_index
    return device


def _in_device_order(backend, func, plan, args, kwargs, outputs, found: list, events) -> list:
    """The op's in-op events with ``("accesses", stream, found, fresh_stream)``
    put where the device runs them."""
    device = _op_device(backend, found)
    current = backend.current_stream(device)
    kinds = [_KINDS.get(name, lambda a: (OTHER, None))(a) for name, a in events]
    stream = current
    if plan.collective:
        waiter = first_waiter(kinds)
        if waiter is not None:
            stream = waiter  # the backend's own stream, launched after the current one
        elif collectives.launched_from_python_api(sys._getframe(1)):
            own = backend.collective_stream(collectives.group_number(func, args, kwargs), device)
            if own is not None:
                return [*events, *_on_own_stream(backend, own, current, found, outputs)]
    point = access_point(kinds, stream)
    after = output_point(kinds, stream)
    outputs = [a for a in found if a.fresh]
    if outputs and after > point:  # written after the op's host sync (nonzero's output)
        inputs = [a for a in found if not a.fresh]
        return [*events[:point], ("accesses", (stream, inputs, current)), *events[point:after],
                ("accesses", (stream, outputs, current)), *events[after:]]
    return [*events[:point], ("accesses", (stream, found, current)), *events[point:]]


def _on_own_stream(backend, own: tuple, current: tuple, found: list, outputs) -> list:
    """A collective on its process group's own stream: ordered after the
    current stream at the launch, ended by an event its Work waits for."""
    event = collectives.WORKS.new_event()
    work = collectives.work_of(outputs)
    if work is not None:
        collectives.WORKS.track(work, event, backend.hub.event)
    return [
        ("on_wait_stream", (own, current)),
        ("accesses", (own, found, current)),
        ("on_event_created", (event,)),
        ("on_event_record", (event, own)),
    ]
