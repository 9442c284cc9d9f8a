"""Feeds a schedule to the lifetime model, step by step, the way the torch
front end feeds a program: an ``Op``'s in-op events arrive first and its
accesses after them, put back in place by ``lifetime.op_order``.  Host
thread steps become the model's ``fork_host`` / ``set_host`` /
``join_host``; thread 0 is the model's default host (``None``).

A wait on an event never recorded is a no-op on the device and not a
finding (the contract: BRIEF's semantics, README, design/sanitizer.md); the
model still reports it as ``UnrecordedEventWait`` for front ends to drop,
and ``run_model`` drops it as the sanitizer does."""
from __future__ import annotations

from ..lifetime import (
    DataRace,
    InvalidFree,
    LifetimeModel,
    ReuseRace,
    UncoveredFree,
    UnrecordedEventWait,
    UseAfterFree,
)
from ..lifetime.op_order import HOST_SYNC, OTHER, RECORD, WAIT, access_point
from . import keys
from .schedule import (
    Adopt, Alloc, DeleteEvent, EraseStream, Free, Join, Op, QueryEvent, Read, RecordEvent, RecordStream,
    RecordUse, Schedule, Spawn, Switch, SyncDevice, SyncEvent, SyncStream, View, WaitEvent, WaitStream, Write,
)


def feed(schedule: Schedule, model: LifetimeModel) -> None:
    """Replays ``schedule`` into ``model``.  Sites are step indices and a
    storage is named by the index of the step that allocated it."""
    for stream in range(schedule.streams):
        model.create_stream(stream, device=schedule.device_of(stream))
    for event in range(schedule.events):
        model.create_event(event)
    storage_of: dict = {}
    for i, step in enumerate(schedule.steps):
        _STEP[type(step)](model, step, i, storage_of)


def run_model(schedule: Schedule, model_class=None) -> list:
    """The model's findings on ``schedule``, flushed at its end, as keys
    (``model_class``: another implementation of the model, such as
    ``lifetime.NativeLifetimeModel``; by default ``LifetimeModel``)."""
    model = (model_class or LifetimeModel)()
    feed(schedule, model)
    return keys.sort(finding_key(f) for f in model.flush() if not isinstance(f, UnrecordedEventWait))


def finding_key(finding) -> tuple:
    if isinstance(finding, DataRace):
        return keys.race(finding.access.site, finding.prior.site)
    if isinstance(finding, UncoveredFree):
        return keys.uncovered_free(
            finding.free_site, finding.storage, finding.usage_stream, finding.last_use.site
        )
    if isinstance(finding, ReuseRace):
        return keys.reuse_race(
            finding.access.site, finding.storage, finding.previous,
            finding.usage_stream, finding.previous_use.site,
        )
    if isinstance(finding, InvalidFree):
        return keys.invalid_free(finding.site, finding.reason)
    if isinstance(finding, UseAfterFree):
        return keys.use_after_free(finding.site, finding.storage)
    if isinstance(finding, UnrecordedEventWait):
        return keys.unrecorded_event_wait(finding.site)
    raise TypeError(f"not a finding: {finding!r}")


def _alloc(m, s: Alloc, i, storage_of):
    storage_of[s.tensor] = i
    m.allocate(i, s.stream, s.address, s.size, site=i)


def _adopt(m, s: Adopt, i, storage_of):
    storage_of[s.tensor] = i
    m.allocate(i, s.stream, s.address, s.size, site=i, preexisting=True)


def _view(m, s: View, i, storage_of):
    storage_of[s.tensor] = storage_of[s.base]


def _host(thread: int):
    """The model's host for a schedule thread (0: the model's default)."""
    return None if thread == 0 else thread


def _delete_event(m, s: DeleteEvent, i, storage_of):
    m.delete_event(s.event)
    m.create_event(s.event)  # the number now names a new event


def _kind(step, op_stream) -> tuple:
    """How the front end classifies an in-op event (see lifetime.op_order)."""
    if isinstance(step, RecordEvent):
        return (RECORD, step.stream)
    if isinstance(step, WaitEvent):
        return (WAIT, step.stream)
    if isinstance(step, (SyncStream, SyncEvent, QueryEvent, SyncDevice)):
        return (HOST_SYNC, None)
    return (OTHER, None)


def _op(m, s: Op, i, storage_of):
    """As the front end sees an op: its in-op events in issue order, then its
    accesses, which ``access_point`` puts back among them."""
    inside = (*s.before, *s.after)
    point = access_point([_kind(e, s.stream) for e in inside], s.stream)
    for event in inside[:point]:
        _STEP[type(event)](m, event, i, storage_of)
    written = {storage_of[t] for t in s.writes}
    seen: dict = {}
    for t in (*s.reads, *s.writes):
        seen.setdefault(storage_of[t], None)
    for storage in seen:
        m.access(storage, s.stream, storage in written, op="op", site=i)
    for event in inside[point:]:
        _STEP[type(event)](m, event, i, storage_of)


_STEP = {
    Alloc: _alloc,
    Adopt: _adopt,
    View: _view,
    Op: _op,
    DeleteEvent: _delete_event,
    Read: lambda m, s, i, st: m.read(st[s.tensor], s.stream, op="read", site=i),
    Write: lambda m, s, i, st: m.write(st[s.tensor], s.stream, op="write", site=i),
    Free: lambda m, s, i, st: m.free(st[s.tensor], site=i),
    RecordStream: lambda m, s, i, st: m.record_stream(st[s.tensor], s.stream, site=i),
    EraseStream: lambda m, s, i, st: m.erase_stream(st[s.tensor], s.stream, site=i),
    RecordUse: lambda m, s, i, st: m.record_use(st[s.tensor], s.stream, site=i),
    RecordEvent: lambda m, s, i, st: m.record_event(s.event, s.stream),
    WaitEvent: lambda m, s, i, st: m.wait_event(s.stream, s.event, site=i),
    SyncEvent: lambda m, s, i, st: m.synchronize_event(s.event, site=i),
    QueryEvent: lambda m, s, i, st: m.event_query_complete(s.event, site=i),
    WaitStream: lambda m, s, i, st: m.wait_stream(s.waiter, s.waitee),
    SyncStream: lambda m, s, i, st: m.synchronize_stream(s.stream),
    SyncDevice: lambda m, s, i, st: m.synchronize_device(s.device),
    Spawn: lambda m, s, i, st: m.fork_host(_host(s.thread)),
    Switch: lambda m, s, i, st: m.set_host(_host(s.thread)),
    Join: lambda m, s, i, st: m.join_host(_host(s.thread)),
}
