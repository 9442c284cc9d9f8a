"""What the lifetime model reports: one frozen dataclass per kind of finding.

Sites (allocation, access, free) are opaque to the model: the torch front end
passes a captured stack, the schedule runner passes a step index.  They only
need to be printable; ``site_to_json`` turns them into JSON values.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, NamedTuple, Optional

Stream = Hashable
Site = Any
Namer = Callable[[Stream], str]  # a stream's name in a report


def _stream_name(stream: Stream) -> str:
    return f"stream {stream}"


class Access(NamedTuple):
    """One read or write of a storage, as queued on ``stream``.

    ``clock`` is the stream's own logical time at the access: the access is
    ordered before any point whose view of ``stream`` has reached it.  (A
    named tuple: one is made per access, and a tuple is the cheapest to make.)
    """

    stream: Stream
    clock: int
    is_write: bool
    op: Optional[str] = None
    site: Site = None
    args: tuple = ()  # the op's argument names that refer to the storage

    @property
    def verb(self) -> str:
        return "write" if self.is_write else "read"

    @property
    def what(self) -> str:
        """``aten::add_[self]``: the op and the arguments that touched the storage."""
        name = self.op or self.verb
        return f"{name}[{', '.join(self.args)}]" if self.args else name


@dataclass(frozen=True, slots=True)
class DataRace:
    """``access`` is not ordered after ``prior``, and one of them writes."""

    storage: Hashable
    address: Optional[int]
    access: Access
    prior: Access
    alloc_site: Site = None  # where the raced storage was allocated
    kind = "data_race"

    @property
    def race(self) -> str:
        return f"{self.access.verb}-after-{self.prior.verb}"

    def fix(self, name: Namer = _stream_name) -> str:
        waiter, waitee = name(self.access.stream), name(self.prior.stream)
        return (
            f"make {waiter} wait for {waitee} after the {self.prior.verb} "
            f"({self.prior.op or 'op'}) and before the {self.access.verb} ({self.access.op or 'op'}): "
            f"`<{waiter}>.wait_stream(<{waitee}>)`, or an event recorded on {waitee} and "
            "waited on. record_stream/record_use do not order accesses."
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
    # what happened to the memory afterwards (None for a live storage)
    outcome: Optional["ReuseOutcome"] = field(default=None, compare=False, repr=False)
    kind = "uncovered_free"

    @property
    def actual(self) -> bool:
        """A reuse race followed: the hazard became corruption."""
        return self.outcome is not None and self.outcome.race is not None

    def fix(self, name: Namer = _stream_name) -> str:
        u, a = name(self.usage_stream), name(self.alloc_stream)
        return (
            f"after the last use on {u} ({self.last_use.op or self.last_use.verb}), "
            f"call `npu_lifetime.record_use(x, <{u}>)`; or `x.record_stream(<{u}>)` "
            f"before the free; or `<{a}>.wait_stream(<{u}>)` before the free."
        )


@dataclass(frozen=True, slots=True)
class ReuseRace:
    """The memory of an uncovered free went to a new owner (``storage``, any
    allocation overlapping the freed range), and ``access`` by the new owner
    is not ordered after ``previous_use``, the previous owner's use that the
    free left outstanding: one of them may run while the other's data is
    there.  This is the corruption the uncovered ``free`` made possible."""

    storage: Hashable
    address: Optional[int]
    access: Access
    alloc_site: Site  # the new owner's allocation
    previous: Hashable  # the previous owner's storage
    previous_use: Access
    free: UncoveredFree  # the previous owner's uncovered free (now actual)
    kind = "reuse_race"

    @property
    def usage_stream(self) -> Stream:
        return self.previous_use.stream

    def fix(self, name: Namer = _stream_name) -> str:
        return "cover the previous owner's free: " + self.free.fix(name)


@dataclass(slots=True, eq=False)
class ReuseOutcome:
    """What became of an uncovered free's memory, for classifying it as
    *actual* (a reuse race followed) or *latent* (not yet, and why)."""

    reuses: int = 0  # new owners of (part of) the memory seen so far
    safe_reuse: Optional[Access] = None  # a new owner's first access ordered after the use
    host_synced: bool = False  # the host synchronised past the use: nothing can race any more
    held_by_allocator: bool = False  # the allocator holds the memory until the use is done
    forgotten: bool = False  # no longer tracked (too many outstanding uses)
    race: Optional[ReuseRace] = None
    sync_site: Site = None  # where the host waited past the use (host_synced)

    @property
    def actual(self) -> bool:
        return self.race is not None

    def reason(self, name: "Namer" = None) -> str:
        """Why no reuse raced with the use (so far), or which one did."""
        name = name or _stream_name
        if self.race is not None:
            return "a new owner of the memory accessed it while the use could still be running (reuse race)"
        if self.safe_reuse is not None:
            return (f"the memory was reused, and the new owner's accesses were ordered after the use: "
                    f"{name(self.safe_reuse.stream)} had waited for the use's stream (wait_stream / wait_event)")
        if self.held_by_allocator:
            return ("only the shim's protection: told of the use by the sanitizer (note_use), it held the block "
                    "until the use was done; the framework's own caching allocator would not (this is not safe)")
        if self.host_synced:
            where = f" at {self.sync_site}" if self.sync_site is not None else ""
            return (f"the memory was not reused before the host waited past the use{where}; a reuse before that "
                    "wait would have raced")
        if self.forgotten:
            return "no reuse seen before the sanitizer stopped tracking this use (too many outstanding)"
        if self.reuses:
            return "the memory was reused, but the new owner has not accessed it yet"
        return "the memory was not reused while the sanitizer watched"


@dataclass(frozen=True, slots=True)
class InvalidFree:
    """A free of a storage that is not live: ``reason`` is ``double`` (it was
    freed before, at ``first_free_site``) or ``unknown`` (never allocated)."""

    storage: Hashable
    reason: str
    site: Site
    first_free_site: Site = None
    kind = "invalid_free"

    def fix(self, name: Namer = _stream_name) -> str:
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

    def fix(self, name: Namer = _stream_name) -> str:
        return "keep a reference to the tensor until its last use has been queued."


@dataclass(frozen=True, slots=True)
class UnrecordedEventWait:
    """A wait (by a stream, or by the host when ``stream`` is None) on an
    event that was never recorded: it completes at once and orders nothing."""

    event: Hashable
    stream: Optional[Stream]
    site: Site
    kind = "unrecorded_event_wait"

    def fix(self, name: Namer = _stream_name) -> str:
        return "record the event on the producing stream before waiting on it."


Finding = DataRace | UncoveredFree | ReuseRace | InvalidFree | UseAfterFree | UnrecordedEventWait


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
            "args": list(value.args),
            "access": value.verb,
            "site": site_to_json(value.site),
        }
    if isinstance(value, ReuseOutcome):
        return {"actual": value.actual, "reason": value.reason(), "reuses": value.reuses}
    if isinstance(value, UncoveredFree):
        return {"storage": _value_to_json(value.storage), "free_site": site_to_json(value.free_site)}
    if value is None or isinstance(value, (int, float, str, bool)):
        return value
    if isinstance(value, tuple):
        return [_value_to_json(v) for v in value]
    return str(value)


def finding_to_json(finding: Finding, name: Namer = _stream_name) -> dict:
    """A JSON-ready dict of every field of ``finding`` plus its kind and fix
    (streams in the fix named by ``name``)."""
    out: dict = {"kind": finding.kind}
    for field_name in finding.__dataclass_fields__:
        value = getattr(finding, field_name)
        out[field_name] = site_to_json(value) if field_name.endswith("site") else _value_to_json(value)
    if isinstance(finding, DataRace):
        out["race"] = finding.race
    if isinstance(finding, UncoveredFree) and not finding.live:
        out["actual"] = finding.actual
    out["fix"] = finding.fix(name)
    return out
