"""What becomes of a sanitizer's findings: grouped, counted, raised or
warned once, and classified as failing the check or latent.

* One group per distinct (kind, sites, streams): a race in a loop is one
  finding with a count, and memory is bounded by the program's distinct
  sites, not by its iterations.
* Races (data races and reuse races) are raised or warned when their group
  is new (``on_race``); uncovered frees are warned when new (they happen in
  destructors and allocator hooks, where raising is impossible).  Warnings
  are issued after the event is fully processed: a warning turned into an
  error (``-W error``) loses nothing, the finding is retained either way.
* An uncovered free is *actual* once a reuse race followed it (any free of
  its group), else *latent*: the classification is the diagnosis, not the
  verdict.  Every race and every uncovered free fails a check (``Policy``),
  unless silenced explicitly: a suppression rule matching its kind and a
  site, or ``allow_latent`` for latent frees whose safety does not rest on
  the allocator holding the block (the shim's hold never counts as safe).
  A live storage's would-be uncovered use (reported by a flush) fails only
  under ``strict``: nothing was freed.  A wait on an event never recorded
  is a no-op (as on CUDA) and not a finding: the sanitizer does not retain
  it (a finding built by hand still passes).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

from ..lifetime import DataRace, InvalidFree, ReuseRace, UncoveredFree, UnrecordedEventWait, UseAfterFree
from . import sites
from .suppressions import Suppressions

ON_RACE = ("raise", "warn", "collect")
_SAMPLED_OUTCOMES = 8


def group_key(f) -> tuple:
    k = sites.key
    if isinstance(f, DataRace):
        a, p = f.access, f.prior
        return ("data_race", k(a.site), k(p.site), a.stream, p.stream, a.is_write, p.is_write)
    if isinstance(f, UncoveredFree):
        return ("uncovered_free", k(f.alloc_site), k(f.last_use.site), k(f.free_site),
                f.alloc_stream, f.usage_stream, f.live)
    if isinstance(f, ReuseRace):
        return ("reuse_race", k(f.access.site), k(f.alloc_site), k(f.previous_use.site),
                k(f.free.free_site), f.access.stream, f.previous_use.stream)
    if isinstance(f, InvalidFree):
        return ("invalid_free", f.reason, k(f.site))
    if isinstance(f, UseAfterFree):
        return ("use_after_free", k(f.site), f.stream, f.op)
    if isinstance(f, UnrecordedEventWait):
        return ("unrecorded_event_wait", k(f.site), f.stream)
    return ("other", repr(f))


_NAMED_STORAGES = 8  # findings kept per group to name its distinct storages
_COUNTED_STORAGES = 4096  # distinct storages counted per group, at most


@dataclass
class Group:
    first: object
    count: int = 1
    actual: bool = False
    held: bool = False
    outcomes: list = field(default_factory=list)  # a sample of the frees' ReuseOutcomes
    storages: set = field(default_factory=set)  # distinct storage ids (bounded)
    named: list = field(default_factory=list)  # the first finding of each of the first distinct storages

    def note_storage(self, f) -> None:
        storage = getattr(f, "storage", None)
        if storage is None or storage in self.storages or len(self.storages) >= _COUNTED_STORAGES:
            return
        self.storages.add(storage)
        if len(self.named) < _NAMED_STORAGES:
            self.named.append(f)


@dataclass(frozen=True)
class GroupInfo:
    count: int
    actual: bool
    reasons: tuple  # (reason, how many of the sampled frees) for a latent free
    held: bool = False  # a free of the group was safe only because the allocator held the block
    storages: tuple = ()  # distinct storages of the group (a bounded sample), for reports
    distinct: int = 1  # how many distinct storages the group holds

    def fails(self, finding, policy: "Policy" = None) -> bool:
        return (policy or DEFAULT).verdict(finding, self)[0]


@dataclass(frozen=True)
class Policy:
    """What fails a check.  By default: every race, every uncovered free
    (latent or actual), invalid frees and uses after free.  ``allow_latent``
    lets latent uncovered frees pass (not those the allocator's hold kept
    safe); ``strict`` also fails live storages' would-be uncovered uses;
    ``suppressions`` silence matching findings explicitly."""

    allow_latent: bool = False
    strict: bool = False
    suppressions: Suppressions = field(default_factory=Suppressions)

    def verdict(self, finding, info: GroupInfo) -> tuple:
        """``(fails, why not)``: why not is "" when it fails, else a short
        reason ("suppressed by RULE", "latent (--allow-latent)", "live")."""
        kinds = finding_kinds(finding, info)
        rule = self.suppressions.match(finding, kinds) if self.suppressions else None
        if rule is not None:
            return False, f"suppressed by {rule}"
        if isinstance(finding, UncoveredFree):
            if finding.live:
                return (True, "") if self.strict else (False, "live")
            if self.allow_latent and "latent_free" in kinds:
                return False, "latent (allowed: --allow-latent)"
        if isinstance(finding, UnrecordedEventWait):
            return False, "no-op wait"
        return True, ""


DEFAULT = Policy()


def finding_kinds(finding, info: GroupInfo) -> tuple:
    """The kinds a suppression rule may name for ``finding``."""
    if isinstance(finding, UncoveredFree):
        if finding.live:
            return ("uncovered_use",)
        if not info.actual and not info.held:
            return ("uncovered_free", "latent_free")
        return ("uncovered_free",)
    return (finding.kind,)


class Findings:
    """The retained findings of one sanitizer, grouped; ``name`` names
    streams in the reasons given for latent frees."""

    def __init__(self, name=None) -> None:
        self._groups: dict = {}
        self._name = name

    def add(self, findings: list) -> list:
        """Retains ``findings``; returns those that opened a new group."""
        new = []
        for f in findings:
            key = group_key(f)
            g = self._groups.get(key)
            if g is None:
                g = self._groups[key] = Group(f)
                new.append(f)
            else:
                g.count += 1
            g.note_storage(f)
            if isinstance(f, UncoveredFree) and f.outcome is not None:
                if f.outcome.held_by_allocator:
                    g.held = True
                if len(g.outcomes) < _SAMPLED_OUTCOMES:
                    g.outcomes.append(f.outcome)
            if isinstance(f, ReuseRace):
                freed = self._groups.get(group_key(f.free))
                if freed is not None:
                    freed.actual = True
        return new

    def mark_held(self, free) -> None:
        """The allocator holds ``free``'s block until its use is done."""
        g = self._groups.get(group_key(free))
        if g is not None:
            g.held = True

    def __len__(self) -> int:
        return len(self._groups)

    def retained(self) -> list:
        return [g.first for g in self._groups.values()]

    def drain(self) -> tuple:
        """The retained findings and their groups' info, cleared."""
        groups, self._groups = self._groups, {}
        return [g.first for g in groups.values()], {id(g.first): _info(g, self._name) for g in groups.values()}

    def info(self, finding) -> Optional[GroupInfo]:
        g = self._groups.get(group_key(finding))
        return None if g is None else _info(g, self._name)


def _info(g: Group, name) -> GroupInfo:
    actual = g.actual or any(o.actual for o in g.outcomes)
    held = g.held or any(o.held_by_allocator for o in g.outcomes)
    reasons = Counter(o.reason(name) for o in g.outcomes if not o.actual)
    return GroupInfo(g.count, actual, tuple(reasons.most_common()), held, tuple(g.named), len(g.storages) or 1)


def live_info(finding) -> GroupInfo:
    """A flush's would-be uncovered use of a live storage."""
    return GroupInfo(1, False, (("the storage is still alive: this is what a free right now would leave", 1),),
                     False, (finding,), 1)
