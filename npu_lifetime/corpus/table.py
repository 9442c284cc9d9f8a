"""The corpus table: for each case, the sanitizer's verdict on every form
(run as ``npu-lifetime check`` runs a script), what the buggy form's report
names, and on a real device whether the bug shows in the data and what
compute-sanitizer says."""
from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass, field
from typing import Callable, Optional

from . import case_modules
from .case import buggy_forms
from .verdicts import Verdict, check_form, names_ok


@dataclass
class Row:
    case: object  # the Case
    verdicts: dict  # form -> Verdict
    corruption: Optional[dict] = None  # form -> intact (real devices)
    oracle: Optional[dict] = None  # form -> compute-sanitizer errors (cuda)
    notes: list = field(default_factory=list)

    @property
    def buggy(self) -> Verdict:
        return self.verdicts["buggy"]

    @property
    def fixed_clean(self) -> bool:
        return all(v.exit_code == 0 for form, v in self.verdicts.items() if form not in buggy_forms(self.case))

    def _caught(self, verdict: Verdict) -> str:
        """'' when ``verdict`` reports the case's bug as it must, else what is wrong."""
        if verdict.exit_code != 1 or self.case.finding not in verdict.kinds:
            return f"not reported as {self.case.finding}"
        if not names_ok(self.case, verdict.named):
            return "the report does not name the streams and buffer"
        return ""

    @property
    def status(self) -> str:
        """caught, known gap, or WRONG (the sanitizer missed a bug it should see, or flagged a fix)."""
        if not self.fixed_clean:
            return "WRONG: a fixed form fails the check"
        for form in self.case.also_buggy:
            wrong = self._caught(self.verdicts[form])
            if wrong:
                return f"WRONG: {form} form {wrong}"
        if self.case.gap:
            return "known gap" if self.buggy.exit_code == 0 else "caught (was a known gap: update the case)"
        wrong = self._caught(self.buggy)
        return f"WRONG: buggy form {wrong}" if wrong else "caught"

    @property
    def corruption_ok(self) -> Optional[bool]:
        """On a device: the buggy form's data is corrupted and every fixed form's intact."""
        if self.corruption is None:
            return None
        if any(not isinstance(ok, bool) for ok in self.corruption.values()):
            return False
        bug = buggy_forms(self.case)
        return all(not ok if form in bug else ok for form, ok in self.corruption.items())

    @property
    def oracle_agrees(self) -> Optional[bool]:
        """compute-sanitizer reports the buggy form and no fixed form.  It
        tracks stream-ordered lifetimes of kernels' accesses, so a race
        between accesses of memory allocated long before (an ordering bug),
        or a raw-pointer memset or copy (checked when called, not when it
        runs: the known gap), is not its to see: there its silence on the
        buggy form is no verdict (None)."""
        if self.oracle is None:
            return None
        if any(n is None for n in self.oracle.values()):
            return False  # a run that gave no summary
        bug = buggy_forms(self.case)
        fixed_clean = all(n == 0 for form, n in self.oracle.items() if form not in bug)
        if self.oracle.get("buggy", 0) == 0 and (self.case.finding != "uncovered_free" or self.case.gap):
            return None if fixed_clean else False  # what it does not track: no verdict
        return all(self.oracle.get(form, 0) > 0 for form in bug if form in self.oracle) and fixed_clean


def build(device: str, names=None, progress: Optional[Callable] = None) -> list:
    rows = []
    modules = {n: m for n, m in case_modules().items() if (not names or n in names) and device in m.CASE.devices}
    for i, (name, module) in enumerate(modules.items()):
        verdicts = {}
        for form in module.CASE.forms:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                verdicts[form] = check_form(module, form, device)
        rows.append(Row(module.CASE, verdicts))
        if progress:
            progress(i + 1, len(modules), name)
    return rows


def _yes(flag: Optional[bool]) -> str:
    return "-" if flag is None else ("yes" if flag else "NO")


def render(rows: list, device: str) -> str:
    lines = [f"Publicly reported cross-stream bugs, each run as `npu-lifetime check --device {device}` runs a script "
             "(default settings).", ""]
    for row in rows:
        c, b = row.case, row.buggy
        lines.append(f"{c.name}  [{row.status}]")
        lines.append(f"  reported in:  {', '.join(c.threads)}")
        lines.append(f"  the bug:      {c.summary}")
        if b.named:
            n = b.named
            lines.append(f"  buggy form:   exit {b.exit_code}, {', '.join(b.kinds)}; buffer `{n['buffer'] or '?'}`")
            lines.append(f"    produced on {n['producer']}, consumed on {n['consumer']}")
            lines.append(f"    overwritten by: {n['overwrite']}")
            lines.append(f"    fix offered:    {n['fix']}")
        else:
            lines.append(f"  buggy form:   exit {b.exit_code}, no finding" + (f" (known gap: {c.gap})" if c.gap else ""))
        for form in c.also_buggy:
            v = row.verdicts[form]
            lines.append(f"  {form} form:  exit {v.exit_code}, {', '.join(v.kinds) or 'no finding'}"
                         + (f"; last use: {v.named.get('consumer', '')}" if v.named else ""))
        fixed = ", ".join(f"{form} exit {v.exit_code}" for form, v in row.verdicts.items()
                          if form not in buggy_forms(c))
        lines.append(f"  fixed forms:  {fixed}" + "".join(f"; no {f}: {why}" for f, why in c.notes.items()))
        if row.corruption is not None:
            seen = ", ".join(f"{form} {ok if isinstance(ok, str) else 'intact' if ok else 'CORRUPTED'}"
                             for form, ok in row.corruption.items())
            lines.append(f"  on the device, debug shim, slow kernel: {seen} -> as expected: {_yes(row.corruption_ok)}")
        if row.oracle is not None:
            seen = ", ".join(f"{form} {'no summary' if n is None else f'{n} error(s)'}" for form, n in row.oracle.items())
            judged = _yes(row.oracle_agrees) if row.oracle_agrees is not None else \
                "- (not what compute-sanitizer tracks: a race between accesses of long-allocated memory, or a " \
                "raw-pointer copy checked when called)"
            lines.append(f"  compute-sanitizer: {seen} -> agrees: {judged}")
        lines.append("")
    caught = sum(r.status == "caught" for r in rows)
    gaps = sum(r.status == "known gap" for r in rows)
    lines.append(f"{len(rows)} cases: {caught} caught, {gaps} known gap(s), {len(rows) - caught - gaps} wrong")
    return "\n".join(lines)


def as_json(rows: list) -> list:
    return [{"case": r.case.name, "threads": list(r.case.threads), "status": r.status,
             "verdicts": {f: {"exit": v.exit_code, "kinds": v.kinds} for f, v in r.verdicts.items()},
             "named": r.buggy.named, "corruption": r.corruption, "oracle": r.oracle} for r in rows]


def all_as_expected(rows: list) -> bool:
    return all(r.status in ("caught", "known gap") and r.corruption_ok is not False and r.oracle_agrees is not False
               for r in rows)
