"""Reports a person can act on: where the storage was allocated, the
offending access or use (op, arguments, stream, site), the free, what made a
latent free safe so far, and the call that fixes it, with streams named as
the program knows them.  Findings that fail the check come first; those
silenced explicitly (suppressions, ``--allow-latent``) and live storages'
uses after them, each saying why it does not fail."""
from __future__ import annotations

from collections import Counter
from typing import Callable

from ..lifetime import (
    DataRace, InvalidFree, ReuseRace, UncoveredFree, UnrecordedEventWait, UseAfterFree, finding_to_json,
)
from . import user_names
from .finding_policy import DEFAULT, GroupInfo, Policy

Namer = Callable[[tuple], str]
InfoOf = Callable[[object], GroupInfo]


def _size(nbytes: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return ""


def _where(site) -> str:
    return "<no stack>" if site is None else str(site)


def _storage(finding, name=None, alloc_site=None, size: str = "") -> str:
    address = getattr(finding, "address", None)
    text = f"storage {address:#x}" if isinstance(address, int) else f"storage {finding.storage}"
    if hasattr(name, "tensor") and alloc_site is not None:
        code, known = name.tensor(alloc_site)
        if known:
            return f"`{code}` ({text}{', ' + size if size else ''})"
    return f"{text} ({size})" if size else text


def _times(info: GroupInfo) -> str:
    return f" (x{info.count})" if info.count > 1 else ""


_NAMED = 4  # distinct storages named in a group's report


def _storages(info: GroupInfo, name, site_of) -> list:
    """A group over several storages says how many, and names them
    (bounded).  Storages that read the same (an allocator handing one
    address out again, allocated by the same line) are named once, with
    how many of the sample they are."""
    if info.distinct <= 1:
        return []
    texts: dict = {}  # text -> storages of the sample it names, in first-seen order
    for f in info.storages:
        site = site_of(f)
        text = _storage(f, name, site) + f" allocated at {user_names.where(site)}"
        texts[text] = texts.get(text, 0) + 1
    shown = [text + (f" ({n} storages in turn at this address)" if n > 1 else "")
             for text, n in list(texts.items())[:_NAMED]]
    more = info.distinct - sum(list(texts.values())[:_NAMED])
    return [f"  on {info.distinct} distinct storages: " + "; ".join(shown) + (f"; and {more} more" if more > 0 else "")]


def _placeholder_note(name, *streams: str) -> list:
    """What each ``<...>`` stream in a fix stands for: a stream named in
    another function than the paste line's, or one whose making was not seen."""
    notes, unseen = [], False
    for stream in dict.fromkeys(s for s in streams if s.startswith("<")):
        note = name.placeholder_note(stream) if hasattr(name, "placeholder_note") else None
        if note:
            notes.append(f"    {note}")
        else:
            unseen = True
    if unseen:
        notes.append("    (<...>: that stream object; no line of the program that made it was seen)")
    return notes


def _free_fix(f: UncoveredFree, name, at_free: str) -> list:
    """Fixes for an uncovered free that run on the device, with the
    program's own names for the tensor and the streams."""
    if not hasattr(name, "stream_code"):
        return [f"  fix: {f.fix(name)}"]
    use = f.last_use
    if name.is_collective(f.usage_stream):
        return [f"  fix: wait for the collective before the free{at_free}: `work.wait()` on the Work it returned "
                "(or async_op=False)"]
    # each line in the names of the function it is pasted into: the last use's, the free's
    free_site = None if f.live else f.free_site
    t_use, known_use = name.tensor(f.alloc_site, at=use.site)
    t_free, known_free = name.tensor(f.alloc_site, at=free_site)
    u_use, u_free = name.stream_arg(f.usage_stream, at=use.site), name.stream_arg(f.usage_stream, at=free_site)
    a = name.stream_arg(f.alloc_stream, at=free_site)
    lines = [
        "  fix (any one):",
        f"    after the last use on {name(f.usage_stream)} ({use.op or use.verb} at {user_names.where(use.site)}):  "
        f"npu_lifetime.record_use({t_use}, {u_use})",
        f"    before the free{at_free}:  {name.record_stream(t_free, u_free)}",
    ]
    if not name.is_collective(f.alloc_stream):
        lines.append(f"    before the free{at_free}:  {a}.wait_stream({u_free})")
    for tensor, known in dict.fromkeys(((t_use, known_use), (t_free, known_free))):
        if not known:
            lines.append(f"    ({tensor}: {name.tensor_prose(f.alloc_site)})")
    return lines + _placeholder_note(name, u_use, u_free, a) + _import_note(lines, use.site)


def _free_place(site) -> str:
    """Where a fix "before the free" goes, in words a user can act on: the
    free's line, or, for a free no user frame made (the interpreter's
    teardown, a library's thread), the end of the program."""
    frames = site.user_frames() if site is not None and hasattr(site, "user_frames") else []
    if frames:
        return user_names.where(site)
    return "it was freed when the program ended, by the interpreter: put the fix before the end of the script"


def _import_note(lines: list, site) -> list:
    """A fix that calls ``npu_lifetime.`` pasted into a file that never
    imported it would be a NameError: the note says to import it."""
    if any("npu_lifetime." in line for line in lines) and not user_names.imports_npu_lifetime(site):
        where = user_names.where(site).rsplit(":", 1)[0]
        return [f"    (add `import npu_lifetime` at the top of {where}: the fix calls it)"]
    return []


def _uncovered_free(f: UncoveredFree, name: Namer, info: GroupInfo) -> list:
    a, u = name(f.alloc_stream), name(f.usage_stream)
    if f.live:
        label = "uncovered use, still alive"
    else:
        label = "uncovered free, " + ("ACTUAL: a reuse race followed" if info.actual else "latent")
    head = (
        f"{_storage(f, name, f.alloc_site, _size(f.size))}, allocated on {a}, "
        + ("would be freed" if f.live else "was freed")
        + f" while its use on {u} may still be queued"
    )
    use = f.last_use
    lines = [
        f"[{label}] {head}{_times(info)}",
        *_storages(info, name, lambda g: g.alloc_site),
        f"  allocated at:  {_where(f.alloc_site)}",
        f"  last use:      {use.what} ({use.verb}) on {u} at {_where(use.site)}",
        f"  freed at:      {'(still alive: reported by a flush)' if f.live else _where(f.free_site)}",
    ]
    if not info.actual:
        for reason, n in info.reasons:
            lines.append(f"  why latent:    {reason}" + (f" ({n} of the frees)" if info.count > 1 else ""))
    at_free = "" if f.live else f" ({_free_place(f.free_site)})"
    lines += _free_fix(f, name, at_free)
    return lines


def _race_fix(f: DataRace, name) -> list:
    if not hasattr(name, "stream_code"):
        return [f"  fix: {f.fix(name)}"]
    acc, prior = f.access, f.prior
    where = f"before the {acc.verb} ({acc.op or 'op'} at {user_names.where(acc.site)})"
    if name.is_collective(prior.stream):
        return [f"  fix: {where}: wait for the collective, `work.wait()` on the Work it returned "
                "(record_stream/record_use do not order accesses)"]
    waiter, waitee = name.stream_arg(acc.stream, at=acc.site), name.stream_arg(prior.stream, at=acc.site)
    if name.is_collective(acc.stream):
        return [f"  fix: issue the collective after {waitee}'s {prior.verb} ({prior.op or 'op'}): call it on "
                f"{waitee}, or make the current stream wait for it first: `<current stream>.wait_stream({waitee})`"]
    lines = [f"  fix: {where}:  {waiter}.wait_stream({waitee})",
             f"    (or an event recorded on {waitee} after the {prior.verb} and waited on by {waiter}; "
             "record_stream/record_use do not order accesses)"]
    return lines + _placeholder_note(name, waiter, waitee) + _import_note(lines, acc.site)


def _race(f: DataRace, name: Namer, info: GroupInfo) -> list:
    acc, prior = f.access, f.prior
    return [
        f"[data race] {f.race} on {_storage(f, name, f.alloc_site)}: {acc.what} on {name(acc.stream)} is not "
        f"ordered after {prior.what} on {name(prior.stream)}{_times(info)}",
        *_storages(info, name, lambda g: g.alloc_site),
        f"  this {acc.verb}:  {_where(acc.site)}",
        f"  earlier {prior.verb}: {_where(prior.site)}",
        f"  allocated at:  {_where(f.alloc_site)}",
        *_race_fix(f, name),
    ]


def _reuse_race(f: ReuseRace, name: Namer, info: GroupInfo) -> list:
    acc, prev = f.access, f.previous_use
    fix = _free_fix(f.free, name, f" ({user_names.where(f.free.free_site)})")
    fix[0] = fix[0].replace("  fix", "  fix: cover the previous owner's free", 1)
    return [
        f"[reuse race] {_storage(f)} went to a new owner while its previous owner's use on "
        f"{name(prev.stream)} may still run: {acc.what} ({acc.verb}) on {name(acc.stream)} is not "
        f"ordered after {prev.what} ({prev.verb}){_times(info)}",
        *_storages(info, name, lambda g: g.alloc_site),
        f"  new owner allocated at:      {_where(f.alloc_site)}",
        f"  new owner's access:          {_where(acc.site)}",
        f"  previous owner:              {_storage(f.free, name, f.free.alloc_site)}, allocated at "
        f"{_where(f.free.alloc_site)}",
        f"  previous owner's use:        {_where(prev.site)}",
        f"  previous owner freed at:     {_where(f.free.free_site)} (uncovered: now actual)",
        *fix,
    ]


def fix_text(f, name) -> str:
    """The fix lines of ``f``'s report, as one text (the JSON's ``fix``)."""
    if isinstance(f, UncoveredFree):
        lines = _free_fix(f, name, "" if f.live else f" ({user_names.where(f.free_site)})")
    elif isinstance(f, DataRace):
        lines = _race_fix(f, name)
    elif isinstance(f, ReuseRace):
        lines = ["  fix: cover the previous owner's free:"] + _free_fix(f.free, name, "")
    else:
        return f.fix(name)
    text = " ".join(line.strip() for line in lines)
    return text[5:] if text.startswith("fix: ") else text


def _other(f, name: Namer, info: GroupInfo) -> list:
    if isinstance(f, InvalidFree):
        return [f"[invalid free] {f.reason} free of {_storage(f)} at {_where(f.site)}{_times(info)}",
                f"  fix: {f.fix(name)}"]
    if isinstance(f, UseAfterFree):
        return [
            f"[use after free] {f.op} of {_storage(f)} on {name(f.stream)} at {_where(f.site)}, "
            f"freed at {_where(f.free_site)}{_times(info)}",
            f"  fix: {f.fix(name)}",
        ]
    if isinstance(f, UnrecordedEventWait):
        who = "the host" if f.stream is None else name(f.stream)
        return [f"[unrecorded event wait] {who} waited on an event never recorded, at {_where(f.site)}"
                f"{_times(info)}", f"  fix: {f.fix(name)}"]
    return [repr(f)]


def format_finding(f, name: Namer, info: GroupInfo) -> str:
    if isinstance(f, UncoveredFree):
        return "\n".join(_uncovered_free(f, name, info))
    if isinstance(f, DataRace):
        return "\n".join(_race(f, name, info))
    if isinstance(f, ReuseRace):
        return "\n".join(_reuse_race(f, name, info))
    return "\n".join(_other(f, name, info))


def format_findings(findings: list, name: Namer, info_of: InfoOf, policy: Policy = DEFAULT) -> str:
    if not findings:
        return "npu_lifetime: no findings"
    verdicts = [(f, info_of(f)) for f in findings]
    verdicts = [(f, info, *policy.verdict(f, info)) for f, info in verdicts]
    failing = [(f, info) for f, info, fails, _ in verdicts if fails]
    passing = [(f, info, why) for f, info, fails, why in verdicts if not fails]
    head = f"npu_lifetime: {len(findings)} finding(s): {len(failing)} fail the check"
    if passing:
        counts = Counter(why.split(" by ")[0] if why.startswith("suppressed") else why for _, _, why in passing)
        head += ", " + ", ".join(f"{n} {_PASSING[why]}" for why, n in counts.items())
    parts = [head]
    parts += [format_finding(f, name, info) for f, info in failing]
    if passing:
        parts.append(
            "--- not failing: silenced explicitly (suppressions, --allow-latent), or uses of storages still alive "
            "at the end that a free now would leave uncovered (--strict fails on those) ---"
        )
        parts += [format_finding(f, name, info) + f"\n  not failing:   {why}" for f, info, why in passing]
    return "\n\n".join(parts)


_PASSING = {
    "suppressed": "suppressed",
    "latent (allowed: --allow-latent)": "latent allowed (--allow-latent)",
    "live": "live (still alive: not freed)",
    "no-op wait": "no-op waits",
}


def to_json(findings: list, name: Namer, info_of: InfoOf, policy: Policy = DEFAULT) -> list:
    out = []
    for f in findings:
        info = info_of(f)
        fails, why_not = policy.verdict(f, info)
        entry = finding_to_json(f, name)
        for key in ("alloc_stream", "usage_stream", "stream"):
            if isinstance(getattr(f, key, None), tuple):
                entry[key] = name(getattr(f, key))
        for key in ("access", "prior", "last_use", "previous_use"):
            acc = getattr(f, key, None)
            if acc is not None:
                entry[key]["stream"] = name(acc.stream)
        entry["fix"] = fix_text(f, name)
        entry["count"] = info.count
        entry["distinct_storages"] = info.distinct
        entry["fails"] = fails
        if not fails:
            entry["not_failing"] = why_not
        if isinstance(f, UncoveredFree):
            entry["actual"] = info.actual
            entry["latent_reasons"] = [{"reason": r, "frees": n} for r, n in info.reasons]
        entry["text"] = format_finding(f, name, info)
        out.append(entry)
    return out
