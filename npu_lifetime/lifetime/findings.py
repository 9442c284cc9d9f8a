"""What the lifetime model reports: one frozen dataclass per kind of finding.

Sites (allocation, access, free) are opaque to the model: the torch front end
passes a captured stack, the schedule runner passes a step index.  They only
need to be printable; ``site_to_json`` turns them into JSON values.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Hashable, Optional

Stream = Hashable
Site = Any


@dataclass(frozen=True, slots=True)
class Access:
    """One read or write of a storage, as queued on ``stream``.

    ``clock`` is the stream's own logical time at the access: the access is
    ordered before any point whose view of ``stream`` has reached it.
    """

    stream: Stream
    clock: int
    is_write: bool
    op: Optional[str] = None
    site: Site = None

    @property
    def verb(self) -> str:
        return "write" if self.is_write else "read"


@dataclass(frozen=True, slots=True)
class DataRace:
    """``access`` is not ordered after ``prior``, and one of them writes."""

    storage: Hashable
    address: Optional[int]
    access: Access
    prior: Access
    kind = "data_race"

    @property
    def race(self) -> str:
        return f"{self.access.verb}-after-{self.prior.verb}"

    def fix(self) -> str:
        return (
            f"make stream {self.access.stream} wait for stream {self.prior.stream} "
            f"after the {self.prior.verb} ({self.prior.op or 'op'}) and before the "
            f"{self.access.verb} ({self.access.op or 'op'}): "
            f"`stream{self.access.stream}.wait_stream(stream{self.prior.stream})` or "
            f"an event recorded on stream {self.prior.stream} and waited on."
        )


@dataclass(frozen=True, slots=True)
class UncoveredFree:
    """A free (or, with ``live``, a free made right now) that nothing orders
    after ``last_use`` on ``usage_stream``: the allocator may hand the block to
    a new tensor on ``alloc_stream`` while that use is still queued."""

    storage: Hashable
    address: Optional[int]
    size: int
    alloc_stream: Stream
    usage_stream: Stream
    last_use: Access
    alloc_site: Site
    free_site: Site
    live: bool = False
    kind = "uncovered_free"

    def fix(self) -> str:
        u, a = self.usage_stream, self.alloc_stream
        return (
            f"after the last use on stream {u} ({self.last_use.op or self.last_use.verb}), "
            f"call `record_use(x, stream{u})`; or `x.record_stream(stream{u})` "
            f"before the free; or `stream{a}.wait_stream(stream{u})` before the free."
        )


@dataclass(frozen=True, slots=True)
class InvalidFree:
    """A free of a storage that is not live: ``reason`` is ``double`` (it was
    freed before, at ``first_free_site``) or ``unknown`` (never allocated)."""

    storage: Hashable
    reason: str
    site: Site
    first_free_site: Site = None
    kind = "invalid_free"

    def fix(self) -> str:
        if self.reason == "double":
            return "free each storage once; the first free already returned it."
        return "free only storages the allocator handed out."


@dataclass(frozen=True, slots=True)
class UseAfterFree:
    """An operation (access, record_stream, record_use) on a freed storage."""

    storage: Hashable
    stream: Stream
    op: str
    site: Site
    free_site: Site
    kind = "use_after_free"

    def fix(self) -> str:
        return "keep a reference to the tensor until its last use has been queued."


@dataclass(frozen=True, slots=True)
class UnrecordedEventWait:
    """A wait (by a stream, or by the host when ``stream`` is None) on an
    event that was never recorded: it completes at once and orders nothing."""

    event: Hashable
    stream: Optional[Stream]
    site: Site
    kind = "unrecorded_event_wait"

    def fix(self) -> str:
        return "record the event on the producing stream before waiting on it."


Finding = DataRace | UncoveredFree | InvalidFree | UseAfterFree | UnrecordedEventWait


def site_to_json(site: Site) -> Any:
    if site is None or isinstance(site, (int, float, str, bool)):
        return site
    to_json = getattr(site, "to_json", None)
    if callable(to_json):
        return to_json()
    if isinstance(site, (list, tuple)):
        return [site_to_json(s) for s in site]
    return str(site)


def _value_to_json(value: Any) -> Any:
    if isinstance(value, Access):
        return {
            "stream": _value_to_json(value.stream),
            "op": value.op,
            "access": value.verb,
            "site": site_to_json(value.site),
        }
    if value is None or isinstance(value, (int, float, str, bool)):
        return value
    return str(value)


def finding_to_json(finding: Finding) -> dict:
    """A JSON-ready dict of every field of ``finding`` plus its kind and fix."""
    out: dict = {"kind": finding.kind}
    for name in finding.__dataclass_fields__:
        value = getattr(finding, name)
        out[name] = site_to_json(value) if name.endswith("site") else _value_to_json(value)
    if isinstance(finding, DataRace):
        out["race"] = finding.race
    out["fix"] = finding.fix()
    return out
