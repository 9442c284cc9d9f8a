"""What the lifetime sanitizer saw, drawn per storage (``snapshot
--sanitize``): for each storage a finding names, its lifeline in the lane of
the stream that allocated it, from its allocation to its free; its uses in
the lanes of the streams that made them, tied to the lifeline; and the
finding in red where it happened.  This is the picture on the simulated
device, whose CPU tensors the shim never allocates (so the block timeline
is empty there), and beside the blocks on a device.

The sanitizer keeps no host time: the horizontal axis is the order of what
happened to the storage (allocation, uses, free), the same for every storage.
"""
from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Callable

from ..lifetime.findings import UncoveredFree

LABEL_W = 230  # the lane names
STEP_W = 170  # one step of a storage's story
LANE_H = 40
TITLE_H = 26
GAP_H = 14  # between storages
BAR_H = 12


@dataclass
class Step:
    """One thing that happened to a storage, in the lane of ``stream``."""

    stream: object  # the sanitizer's stream key (None: the host)
    kind: str  # alloc | use | free | end | finding
    label: str
    tip: str


@dataclass
class StorageLine:
    title: str  # the storage as the report names it
    steps: list = field(default_factory=list)


def from_findings(findings: list, report: Callable[[list], str]) -> list:
    """One line per storage named by an uncovered free (its allocation, its
    last use on each stream, its free, the findings at the free), and one
    per other finding (the accesses it names, the finding at the last)."""
    frees: dict = {}
    lines: list = []
    for f in findings:
        if isinstance(f, UncoveredFree):
            frees.setdefault(f.storage, []).append(f)
        else:
            lines.append(StorageLine(_title(report([f])), _other_steps(f, _finding_text(report([f])))))
    return [StorageLine(_title(report(group)), _free_steps(group, report)) for group in frees.values()] + lines


def _title(report_text: str) -> str:
    """The storage as the report's finding line names it (`` `x` (storage 0x..., 4.0 KiB)``)."""
    head = _finding_text(report_text).splitlines()[0]
    named = head.split("] ", 1)[-1]
    return named.split(", allocated on", 1)[0][:160]


def _finding_text(report_text: str) -> str:
    """The report from its first finding line on (without the summary line above it)."""
    lines = report_text.strip().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("[")), 0)
    return "\n".join(lines[start:]) or "a finding"


def _site(site) -> str:
    return "no stack" if site is None else str(site)


def _free_steps(group: list, report: Callable[[list], str]) -> list:
    first = group[0]
    steps = [Step(first.alloc_stream, "alloc", "allocated", f"allocated at {_site(first.alloc_site)}")]
    for f in group:
        use = f.last_use
        what = "write" if use.is_write else "read"
        steps.append(Step(use.stream, "use", f"last {what}: {use.op or 'use'}",
                          f"last {what} on this stream ({use.op}) at {_site(use.site)}"))
    if first.live:
        steps.append(Step(first.alloc_stream, "end", "alive at the end", "still alive when the script ended"))
    else:
        steps.append(Step(first.alloc_stream, "free", "freed", f"freed at {_site(first.free_site)}"))
    for f in group:
        kind = "uncovered use (alive)" if f.live else f"uncovered free ({_latency(f)})"
        steps.append(Step(first.alloc_stream, "finding", kind, _finding_text(report([f]))))
    return steps


def _latency(f) -> str:
    outcome = getattr(f, "outcome", None)
    return "actual" if outcome is not None and outcome.race is not None else "latent"


def _other_steps(f, text: str) -> list:
    steps = []
    for name in ("previous_use", "prior", "access"):
        use = getattr(f, name, None)
        if use is not None:
            what = "write" if use.is_write else "read"
            steps.append(Step(use.stream, "use", f"{what}: {use.op or 'use'}", f"{what} at {_site(use.site)}"))
    stream = steps[-1].stream if steps else getattr(f, "stream", None)
    steps.append(Step(stream, "finding", f.kind.replace("_", " "), text))
    return steps


# -- drawing ------------------------------------------------------------------------------------------
def render(lines: list, describe: Callable[[object], str]) -> str:
    """The HTML section: an inline SVG, one group of lanes per storage."""
    if not lines:
        return "<p>The sanitizer reported nothing: no storage to draw.</p>"
    width = LABEL_W + STEP_W * (max(_columns(line) for line in lines) + 1)
    parts, y = [], 0
    for line in lines:
        part, height = _storage(line, y, describe)
        parts.append(part)
        y += height + GAP_H
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{y}" font-family="sans-serif" '
           f'font-size="11">{_STYLE}{"".join(parts)}</svg>')
    return (f'<p>{len(lines)} storage(s) the sanitizer reported on, each from its allocation to its free (left to '
            'right: the order of events, not time: the sanitizer keeps none). One lane per stream, named as the '
            'program names it; hover a shape for its source line.</p>'
            f'<div class="picture">{svg}</div>{_LEGEND}')


def _columns(line: StorageLine) -> int:
    return sum(1 for s in line.steps if s.kind != "finding")


def _name(stream, describe: Callable[[object], str]) -> str:
    if stream is None:
        return "host"
    try:
        return describe(stream)
    except Exception:  # a key the sanitizer no longer knows: its raw form still tells streams apart
        return str(stream)


def _storage(line: StorageLine, top: int, describe: Callable[[object], str]) -> tuple:
    lanes: list = []
    for s in line.steps:
        if s.stream not in lanes:
            lanes.append(s.stream)
    out = [f'<text x="4" y="{top + 17}" class="title">{_e(line.title)}</text>']
    lane_y = {stream: top + TITLE_H + i * LANE_H for i, stream in enumerate(lanes)}
    for stream, y in lane_y.items():
        out.append(f'<rect x="0" y="{y}" width="100%" height="{LANE_H - 4}" class="lane"/>'
                   f'<text x="6" y="{y + 17}" class="lanename">{_e(_name(stream, describe))}</text>')
    out += _marks(line, lane_y)
    return "".join(out), TITLE_H + LANE_H * len(lanes)


def _marks(line: StorageLine, lane_y: dict) -> list:
    """The lifeline and ties (under), the points and findings (over them)."""
    under, out, column, bar = [], [], 0, None  # bar: (stream, x where the lifeline starts)
    last_x = LABEL_W
    for s in line.steps:
        mid = lane_y[s.stream] + (LANE_H - 4) / 2
        if s.kind == "finding":  # on the step before it (the free, or the access that raced), over its dot
            out.append(_diamond(last_x, mid, s))
            continue
        x = LABEL_W + STEP_W * column + STEP_W / 2
        column, last_x = column + 1, x
        if s.kind == "alloc":
            bar = (s.stream, x)
        elif bar is not None and s.kind in ("free", "end"):
            stream, start = bar
            y = lane_y[stream] + (LANE_H - 4 - BAR_H) / 2
            edge = "free" if s.kind == "free" else "open"
            under.append(f'<rect x="{start}" y="{y}" width="{x - start}" height="{BAR_H}" class="life"/>'
                       f'<line x1="{x}" y1="{y - 2}" x2="{x}" y2="{y + BAR_H + 2}" class="{edge}"/>')
        elif bar is not None and s.kind == "use" and s.stream != bar[0]:
            bar_mid = lane_y[bar[0]] + (LANE_H - 4) / 2
            under.append(f'<line x1="{x}" y1="{bar_mid}" x2="{x}" y2="{mid}" class="tie"/>')
        out.append(_point(x, mid, s))
    return under + out


def _point(x: float, y: float, s: Step) -> str:
    shape = {"alloc": "alloc", "use": "use", "free": "freemark", "end": "freemark"}[s.kind]
    return (f'<g><title>{_e(s.tip)}</title><circle cx="{x}" cy="{y}" r="5" class="{shape}"/>'
            f'<text x="{x + 8}" y="{y + 4}" class="label">{_e(s.label)}</text></g>')


def _diamond(x: float, y: float, s: Step) -> str:
    return (f'<g class="finding"><title>{_e(s.tip)}</title>'
            f'<rect x="{x - 6}" y="{y - 6}" width="12" height="12" transform="rotate(45 {x} {y})" class="bad"/>'
            f'<text x="{x + 10}" y="{y + 15}" class="badlabel">{_e(s.label)}</text></g>')


def _e(text: str) -> str:
    return html.escape(text, quote=True)


_STYLE = (
    "<style>.title{font-weight:bold;font-size:12px}.lane{fill:#f7f7f7}.lanename{font-weight:bold}"
    ".life{fill:#9ecae1;stroke:#555;stroke-width:0.8}.free{stroke:#222;stroke-width:2.5}"
    ".open{stroke:#999;stroke-width:2.5;stroke-dasharray:3 2}.tie{stroke:#555;stroke-dasharray:3 2}"
    ".alloc{fill:#2ca02c}.use{fill:#1f77b4}.freemark{fill:#222}.bad{fill:white;stroke:#d62728;stroke-width:2.5}"
    ".label{fill:#111;stroke:white;stroke-width:3px;paint-order:stroke}"
    ".badlabel{fill:#d62728;font-weight:bold;stroke:white;stroke-width:3px;paint-order:stroke}</style>"
)
_LEGEND = (
    '<ul class="legend"><li>green dot: the allocation; blue bar: the storage alive, in the lane of its allocation '
    'stream; dark edge: its free (dashed: still alive at the end)</li><li>blue dot: a use on another stream, tied '
    'to the lifeline it used</li><li>red diamond: the sanitizer\'s finding, where it happened (hover: its report)'
    '</li></ul>'
)

