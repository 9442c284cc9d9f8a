"""Feeds a schedule to the lifetime model, step by step."""
from __future__ import annotations

from ..lifetime import (
    DataRace,
    InvalidFree,
    LifetimeModel,
    UncoveredFree,
    UnrecordedEventWait,
    UseAfterFree,
)
from . import keys
from .schedule import (
    Alloc, EraseStream, Free, QueryEvent, Read, RecordEvent, RecordStream, RecordUse,
    Schedule, SyncDevice, SyncEvent, SyncStream, View, WaitEvent, WaitStream, Write,
)


def feed(schedule: Schedule, model: LifetimeModel) -> None:
    """Replays ``schedule`` into ``model``.  Sites are step indices and a
    storage is named by the index of the step that allocated it."""
    for stream in range(schedule.streams):
        model.create_stream(stream)
    for event in range(schedule.events):
        model.create_event(event)
    storage_of: dict = {}
    for i, step in enumerate(schedule.steps):
        _STEP[type(step)](model, step, i, storage_of)


def run_model(schedule: Schedule) -> list:
    """The model's findings on ``schedule``, flushed at its end, as keys."""
    model = LifetimeModel()
    feed(schedule, model)
    return keys.sort(finding_key(f) for f in model.flush())


def finding_key(finding) -> tuple:
    if isinstance(finding, DataRace):
        return keys.race(finding.access.site, finding.prior.site)
    if isinstance(finding, UncoveredFree):
        return keys.uncovered_free(
            finding.free_site, finding.storage, finding.usage_stream, finding.last_use.site
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


def _view(m, s: View, i, storage_of):
    storage_of[s.tensor] = storage_of[s.base]


_STEP = {
    Alloc: _alloc,
    View: _view,
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
    SyncDevice: lambda m, s, i, st: m.synchronize_device(),
}
