"""Suppressions: known-safe patterns, silenced explicitly.

A check fails on every race and every uncovered free (latent or actual).
Where a pattern is known to be safe (for instance FSDP2's reduce-scatter
outputs, latent because a later wait always comes before the memory is
reused), a suppressions file names it, the way sanitizer suppression files
do.  One rule per line::

    # KIND:fun:GLOB  a function name in one of the finding's sites
    # KIND:src:GLOB  a file path in one of the finding's sites
    latent_free:fun:foreach_reduce
    data_race:src:*/third_party/*

``KIND`` is a finding's kind (``data_race``, ``reuse_race``,
``uncovered_free``, ``uncovered_use`` (a live storage's, reported by a
flush), ``invalid_free``, ``use_after_free``), ``latent_free`` (an
uncovered free no reuse raced with, unless only the allocator's hold kept it
safe: a free the shim held back is never latent-safe), or ``*`` (any).
``GLOB`` is an ``fnmatch`` pattern matched against every frame kept for
every site of the finding (allocation, uses, free): the user's frames, and
the innermost library (torch) frames below them, so a pattern inside torch
(``latent_free:fun:foreach_reduce``) can be named.  Blank lines and ``#``
comments are ignored.  A suppressed finding is still reported, under
"suppressed", with the rule that matched it.
"""
from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass
from typing import Iterator, Optional

KINDS = ("data_race", "reuse_race", "uncovered_free", "uncovered_use", "latent_free", "invalid_free",
         "use_after_free", "*")
FIELDS = ("fun", "src")


class SuppressionsError(ValueError):
    """A suppressions file that cannot be read or has a malformed line."""


@dataclass(frozen=True)
class Rule:
    kind: str
    field: str  # "fun" or "src"
    pattern: str
    origin: str  # "FILE:LINE"

    def __str__(self) -> str:
        return f"{self.kind}:{self.field}:{self.pattern} ({self.origin})"

    def matches_frame(self, filename: str, function: str) -> bool:
        value = function if self.field == "fun" else filename
        return fnmatch.fnmatchcase(value, self.pattern)


class Suppressions:
    def __init__(self, rules: tuple = ()) -> None:
        self.rules = tuple(rules)

    def __bool__(self) -> bool:
        return bool(self.rules)

    @classmethod
    def parse(cls, text: str, origin: str = "<suppressions>") -> "Suppressions":
        rules = []
        for number, raw in enumerate(text.splitlines(), 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            where = f"{origin}:{number}"
            parts = line.split(":", 2)
            if len(parts) != 3 or not parts[2].strip():
                raise SuppressionsError(f"{where}: expected KIND:fun:GLOB or KIND:src:GLOB, got {raw.strip()!r}")
            kind, field, pattern = (p.strip() for p in parts)
            if kind not in KINDS:
                raise SuppressionsError(f"{where}: unknown kind {kind!r}; one of {', '.join(KINDS)}")
            if field not in FIELDS:
                raise SuppressionsError(f"{where}: unknown field {field!r}; fun (a function name) or src (a file "
                                        "path glob)")
            rules.append(Rule(kind, field, pattern, where))
        return cls(tuple(rules))

    @classmethod
    def load(cls, path: Optional[str]) -> "Suppressions":
        if not path:
            return cls()
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as err:
            raise SuppressionsError(f"cannot read the suppressions file {path}: {err.strerror or err}") from None
        except UnicodeDecodeError as err:
            raise SuppressionsError(f"{path}: not UTF-8 text (byte {err.start}: {err.reason})") from None
        return cls.parse(text, path)

    def match(self, finding, kinds: tuple) -> Optional[Rule]:
        """The first rule whose kind is one of ``kinds`` (the finding's
        kinds: e.g. ``uncovered_free`` and ``latent_free``) and whose
        pattern matches a frame of one of its sites."""
        candidates = [r for r in self.rules if r.kind == "*" or r.kind in kinds]
        if not candidates:
            return None
        frames = list(_frames(finding))
        for rule in candidates:
            if any(rule.matches_frame(filename, function) for filename, function in frames):
                return rule
        return None


def _sites(finding) -> Iterator:
    for name in ("alloc_site", "free_site", "site", "first_free_site"):
        site = getattr(finding, name, None)
        if site is not None:
            yield site
    for name in ("access", "prior", "last_use", "previous_use"):
        access = getattr(finding, name, None)
        if access is not None and access.site is not None:
            yield access.site
    free = getattr(finding, "free", None)  # a reuse race's previous owner
    if free is not None:
        yield from _sites(free)


def _frames(finding) -> Iterator:
    for site in _sites(finding):
        if isinstance(site, str):
            yield site, site
            continue
        for method in ("user_frames", "library_frames"):
            frames = getattr(site, method, None)
            if callable(frames):
                for filename, _line, function in frames():
                    yield filename, function


def from_environment() -> Suppressions:
    """The file named by ``NPU_LIFETIME_SUPPRESSIONS``, if any."""
    return Suppressions.load(os.environ.get("NPU_LIFETIME_SUPPRESSIONS") or None)
