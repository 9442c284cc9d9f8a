"""Reports a person can act on: where the storage was allocated, the
offending use (op, stream, site), the free, and the call that fixes it."""
from __future__ import annotations

from typing import Callable

from ..lifetime import DataRace, InvalidFree, UncoveredFree, UnrecordedEventWait, UseAfterFree, finding_to_json

Namer = Callable[[tuple], str]


def _size(nbytes: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return ""


def _where(site) -> str:
    if site is None:
        return "<no stack>"
    return str(site)


def _storage(finding) -> str:
    address = getattr(finding, "address", None)
    return f"storage {address:#x}" if isinstance(address, int) else f"storage {finding.storage}"


def _uncovered_free(f: UncoveredFree, name: Namer) -> list:
    a, u = name(f.alloc_stream), name(f.usage_stream)
    head = (
        f"{_storage(f)} ({_size(f.size)}), allocated on {a}, "
        + ("would be freed" if f.live else "was freed")
        + f" while its use on {u} may still be queued"
    )
    use = f.last_use
    return [
        f"[uncovered free] {head}",
        f"  allocated at:  {_where(f.alloc_site)}",
        f"  last use:      {use.op or use.verb} ({use.verb}) on {u} at {_where(use.site)}",
        f"  freed at:      {'(still alive: reported by a flush)' if f.live else _where(f.free_site)}",
        f"  fix: after that last use, call npu_lifetime.record_use(x, <{u}>); or x.record_stream(<{u}>) "
        f"before the free; or <{a}>.wait_stream(<{u}>) before the free.",
    ]


def _race(f: DataRace, name: Namer) -> list:
    acc, prior = f.access, f.prior
    return [
        f"[data race] {f.race} on {_storage(f)}: {acc.op or acc.verb} on {name(acc.stream)} is not ordered "
        f"after {prior.op or prior.verb} on {name(prior.stream)}",
        f"  this {acc.verb}:  {_where(acc.site)}",
        f"  earlier {prior.verb}: {_where(prior.site)}",
        f"  fix: <{name(acc.stream)}>.wait_stream(<{name(prior.stream)}>) (or wait on an event recorded on "
        f"{name(prior.stream)}) after the {prior.verb} and before the {acc.verb}. "
        "record_stream/record_use do not order accesses.",
    ]


def _other(f, name: Namer) -> list:
    if isinstance(f, InvalidFree):
        return [f"[invalid free] {f.reason} free of {_storage(f)} at {_where(f.site)}", f"  fix: {f.fix()}"]
    if isinstance(f, UseAfterFree):
        return [
            f"[use after free] {f.op} of {_storage(f)} on {name(f.stream)} at {_where(f.site)}, "
            f"freed at {_where(f.free_site)}",
            f"  fix: {f.fix()}",
        ]
    if isinstance(f, UnrecordedEventWait):
        who = "the host" if f.stream is None else name(f.stream)
        return [f"[unrecorded event wait] {who} waited on an event never recorded, at {_where(f.site)}",
                f"  fix: {f.fix()}"]
    return [repr(f)]


def format_finding(f, name: Namer) -> str:
    if isinstance(f, UncoveredFree):
        return "\n".join(_uncovered_free(f, name))
    if isinstance(f, DataRace):
        return "\n".join(_race(f, name))
    return "\n".join(_other(f, name))


def format_findings(findings: list, name: Namer) -> str:
    if not findings:
        return "npu_lifetime: no findings"
    body = "\n\n".join(format_finding(f, name) for f in findings)
    return f"npu_lifetime: {len(findings)} finding(s)\n\n{body}"


def to_json(findings: list, name: Namer) -> list:
    out = []
    for f in findings:
        entry = finding_to_json(f)
        for key in ("alloc_stream", "usage_stream", "stream"):
            if isinstance(getattr(f, key, None), tuple):
                entry[key] = name(getattr(f, key))
        for key in ("access", "prior", "last_use"):
            acc = getattr(f, key, None)
            if acc is not None:
                entry[key]["stream"] = name(acc.stream)
        entry["text"] = format_finding(f, name)
        out.append(entry)
    return out
