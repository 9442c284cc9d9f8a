"""Block lives rebuilt from the allocator trace: for each owner of an
address, when it was allocated, what recorded its streams, when it was
freed, how long its free waited on events, and when it became reusable.

Positions are indices into the trace (its order is the shim's order of
calls); ``Lives.times`` maps them to host nanoseconds.  A life whose alloc
came before the trace began has ``alloc=None``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Optional

from .trace import MARK_KINDS, check_events

Key = tuple  # (device, ptr, generation)


@dataclass
class Mark:
    """Something that happened to a block at one moment (see trace.MARK_KINDS)."""

    index: Optional[int]  # None: not in the trace (a finding drained without its event)
    kind: str
    stream: int
    ptr: int
    text: str = ""


@dataclass
class Life:
    """One owner of one address."""

    name: str
    device: int
    ptr: int
    generation: int
    size: int
    alloc_stream: int
    alloc: Optional[int] = None
    free: Optional[int] = None
    pending: Optional[int] = None
    reusable: Optional[int] = None
    marks: list = field(default_factory=list)

    @property
    def key(self) -> Key:
        return (self.device, self.ptr, self.generation)

    def held_until(self, end: int) -> Optional[int]:
        """Where the window between the free and the moment the block could
        be handed out again ends: its last ``reusable`` (a quarantined block
        has two: entering and leaving quarantine), or ``end`` if it still
        waits.  None when it went back to the cache at once."""
        if self.free is None or not self._held():
            return None
        return end if self._still_held() else self.reusable

    def _held(self) -> bool:
        """Freed into a wait (on events, or in quarantine), not into the cache."""
        return self.pending is not None or any(m.kind == "poison" for m in self.marks)

    def _still_held(self) -> bool:
        """Held, and no ``reusable`` came after the last pending or poison."""
        if not self._held():
            return False
        last_wait = max(i for i in (self.pending, *(m.index for m in self.marks if m.kind == "poison"))
                        if i is not None)
        return self.reusable is None or self.reusable < last_wait

    @property
    def state(self) -> str:
        """At the end of the trace: live, held (freed, not yet reusable) or free."""
        if self.free is None:
            return "live"
        return "held" if self._still_held() else "free"

    def waited_streams(self) -> list:
        """Streams whose events the free waits for: record_use and
        record_stream (unless erased again) and noted uses before the free."""
        streams: dict = {}
        for m in self.marks:
            if self.free is not None and m.index is not None and m.index > self.free:
                continue
            if m.kind in ("record_use", "record_stream", "note_use"):
                streams.setdefault(m.stream, set()).add(m.kind)
            elif m.kind == "erase_stream" and m.stream in streams:
                streams[m.stream].discard("record_stream")
                if not streams[m.stream]:
                    del streams[m.stream]
        return [(s, sorted(kinds)) for s, kinds in streams.items()]


@dataclass
class SegmentLife:
    device: int
    ptr: int
    size: int
    stream: int
    alloc: Optional[int]
    free: Optional[int] = None


@dataclass
class Lives:
    events: list
    blocks: list  # Life, in order of first appearance
    segments: list  # SegmentLife
    loose: list  # Mark: findings tied to no block life
    life_of_event: dict  # trace index -> Life
    mark_of_event: dict  # trace index -> Mark

    @property
    def end(self) -> int:
        """The position just after the last event."""
        return len(self.events)

    def t_ns(self, index: Optional[int]) -> Optional[int]:
        if index is None or not self.events:
            return None
        return self.events[min(index, len(self.events) - 1)]["t_ns"]

    def streams(self) -> list:
        """Every (device, stream) a block was allocated or used on, sorted."""
        seen = set()
        for life in self.blocks:
            seen.add((life.device, life.alloc_stream))
            seen.update((life.device, m.stream) for m in life.marks)
        seen.update((s.device, s.stream) for s in self.segments)
        seen.update((0, m.stream) for m in self.loose if m.index is not None)  # the shim traces no device for them
        return sorted(seen)

    def findings(self) -> list:
        """(life or None, mark) for every finding, in trace order."""
        tied = [(life, m) for life in self.blocks for m in life.marks if m.kind == "finding"]
        out = tied + [(None, m) for m in self.loose]
        return sorted(out, key=lambda lm: (lm[1].index is None, lm[1].index or 0))


def build(events: list, shim_findings: Iterable[dict] = ()) -> Lives:
    """Lives from trace events; ``shim_findings`` (``shim.api.findings()``,
    same order) give the finding marks their kind and detail."""
    check_events(events)
    current: dict = {}  # key -> Life
    blocks: list = []
    segments: list = []
    open_segments: dict = {}  # (device, ptr) -> SegmentLife
    loose: list = []
    life_of_event: dict = {}
    mark_of_event: dict = {}
    latest: dict = {}  # ptr -> the latest life at that address

    def life_for(i: int, e: dict, create: bool) -> Optional[Life]:
        key = (e["device"], e["ptr"], e["generation"])
        life = current.get(key)
        if life is None and create:
            life = Life(f"b{len(blocks) + 1}", e["device"], e["ptr"], e["generation"], e["size"], e["alloc_stream"])
            current[key] = life
            blocks.append(life)
            latest[e["ptr"]] = life
        if life is not None:
            life_of_event[i] = life
        return life

    for i, e in enumerate(events):
        kind = e["kind"]
        if kind == "segment_alloc":
            seg = SegmentLife(e["device"], e["ptr"], e["size"], e["stream"], alloc=i)
            open_segments[(e["device"], e["ptr"])] = seg
            segments.append(seg)
        elif kind == "segment_free":
            seg = open_segments.pop((e["device"], e["ptr"]), None)
            if seg is None:  # allocated before the trace began
                seg = SegmentLife(e["device"], e["ptr"], e["size"], e["stream"], alloc=None)
                segments.append(seg)
            seg.free = i
        elif kind == "alloc":
            current.pop((e["device"], e["ptr"], e["generation"]), None)
            life_for(i, e, create=True).alloc = i
        elif kind in ("free", "pending", "reusable"):
            setattr(life_for(i, e, create=True), kind, i)
        elif kind == "finding":
            # the shim traces a finding by address only: it goes to the latest
            # owner of that address, if any (an unknown pointer has none)
            life = latest.get(e["ptr"])
            if life is not None and e["device"] >= 0 and life.device != e["device"]:
                life = None
            if life is not None:
                life_of_event[i] = life
            mark = Mark(i, kind, e["stream"], e["ptr"])
            mark_of_event[i] = mark
            (life.marks if life is not None else loose).append(mark)
        elif kind in MARK_KINDS:
            life = life_for(i, e, create=True)
            mark = Mark(i, kind, e["stream"], e["ptr"])
            mark_of_event[i] = mark
            (life.marks if life is not None else loose).append(mark)
    _describe_findings(blocks, loose, list(shim_findings))
    return Lives(events, blocks, segments, loose, life_of_event, mark_of_event)


def _describe_findings(blocks: list, loose: list, shim_findings: list) -> None:
    """Gives each finding mark the kind and detail of the first unclaimed
    shim finding at its address (both lists are in the shim's order);
    findings without a trace event become loose marks without a position."""
    marks = sorted(
        [m for life in blocks for m in life.marks if m.kind == "finding"] + [m for m in loose if m.kind == "finding"],
        key=lambda m: m.index,
    )
    pending = list(shim_findings)
    for mark in marks:
        match = next((f for f in pending if f.get("address") == mark.ptr), None)
        if match is not None:
            pending.remove(match)
            mark.text = finding_text(match)
    for finding in pending:
        stream, address = finding.get("stream") or 0, finding.get("address") or 0
        loose.append(Mark(None, "finding", stream, address, finding_text(finding)))


def finding_text(finding: dict) -> str:
    detail = finding.get("detail") or ""
    text = f"{finding.get('kind', 'finding')} ({finding.get('op', '?')})"
    return f"{text}: {detail}" if detail else text
