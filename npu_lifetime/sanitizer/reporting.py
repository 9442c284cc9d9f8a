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
  its group), else *latent*; a live storage's would-be uncovered use
  (reported by a flush) is latent too.  By default only actual findings
  fail a check; ``strict`` fails on every contract violation.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

from ..lifetime import DataRace, InvalidFree, ReuseRace, UncoveredFree, UnrecordedEventWait, UseAfterFree
from . import sites

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


@dataclass
class Group:
    first: object
    count: int = 1
    actual: bool = False
    outcomes: list = field(default_factory=list)  # a sample of the frees' ReuseOutcomes


@dataclass(frozen=True)
class GroupInfo:
    count: int
    actual: bool
    reasons: tuple  # (reason, how many of the sampled frees) for a latent free

    def fails(self, finding, strict: bool) -> bool:
        if isinstance(finding, UncoveredFree):
            return strict or self.actual
        return True


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
            if isinstance(f, UncoveredFree) and f.outcome is not None and len(g.outcomes) < _SAMPLED_OUTCOMES:
                g.outcomes.append(f.outcome)
            if isinstance(f, ReuseRace):
                freed = self._groups.get(group_key(f.free))
                if freed is not None:
                    freed.actual = True
        return new

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
    reasons = Counter(o.reason(name) for o in g.outcomes if not o.actual)
    return GroupInfo(g.count, actual, tuple(reasons.most_common()))


def live_info(finding) -> GroupInfo:
    """A flush's would-be uncovered use of a live storage."""
    return GroupInfo(1, False, (("the storage is still alive: this is what a free right now would leave", 1),))
