"""A self-contained HTML page (inline SVG and CSS, no script, nothing
fetched) drawing block lives over time: one lane per stream; each block a
bar in the lane of its allocation stream, from its alloc to its free, then a
hatched window while its free waits on other streams' events, ending where
it became reusable; record_use / record_stream / noted uses drawn in the lane
of the stream they name and tied to the block; findings in red.

The horizontal axis is the order of the trace (one step per event, so short
and long gaps read alike); every shape's tooltip gives host time.  Where the
host time jumps between two events (an idle gap: at least GAP_FACTOR times
the usual step and GAP_MIN_NS) the axis is broken there, across every lane,
and the break is labelled with the idle time.
"""
from __future__ import annotations

import html
import statistics
from dataclasses import dataclass, field
from typing import Optional

from .lives import Life, Lives, Mark
from .trace import describe, stream_name

LABEL_W = 170  # the lane names
ROW_H = 20  # one bar row
MARK_ROW_H = 18  # each lane's row of marks made on it for blocks of other lanes
AXIS_H = 34
GAP_ROW_H = 12  # the row of idle-gap labels under the axis, when there are gaps
GAP_FACTOR = 20  # an idle gap: a step at least this many times the median step ...
GAP_MIN_NS = 100_000  # ... and at least this long
MAX_GAPS = 24  # the longest ones are marked
PALETTE = ("#9ecae1", "#a1d99b", "#fdd0a2", "#bcbddc", "#c7e9c0", "#fdae6b", "#d9d9d9", "#9edae5", "#f7b6d2")
SYMBOLS = {  # mark kind: (shape, colour, legend text)
    "record_use": ("circle", "#1f77b4", "record_use: the free waits for what the stream had queued at this call"),
    "record_stream": ("square", "#7b4fa0", "record_stream: the free waits for all the stream has queued by the free"),
    "erase_stream": ("cross", "#7b4fa0", "erase_stream: a record_stream withdrawn"),
    "note_use": ("triangle", "#e6550d", "a use nothing recorded (the sanitizer told the shim)"),
    "reuse_wait": ("diamond", "#2ca02c", "handed to the next owner at once, behind a GPU-side wait on its events"),
    "poison": ("bar", "#555555", "filled with the poison pattern"),
    "finding": ("bang", "#d62728", "a shim finding"),
}


@dataclass
class SanitizerFinding:
    """A finding of the lifetime sanitizer, placed on the block at its
    address (the sanitizer reports no time: it is drawn at that block's free)."""

    text: str
    address: Optional[int] = None
    device: int = 0
    stream: Optional[int] = None


@dataclass
class Page:
    """What the page says around the picture."""

    title: str = "npu-lifetime: block lifetimes"
    source: str = ""
    facts: list = field(default_factory=list)  # (label, value)
    notice: str = ""  # why the picture is empty or partial
    stream_names: dict = field(default_factory=dict)  # stream handle -> a role ("comm")


def render(lives: Lives, page: Page, sanitizer_findings: tuple = (), max_events: int = 4000,
           storages_html: str = "") -> str:
    """The HTML page.  At most ``max_events`` trace events are drawn (the
    latest); the tables list every block.  ``storages_html``: the section
    drawing what the sanitizer saw (storage_lines.render), if it ran."""
    start = max(0, lives.end - max_events)
    canvas = _Canvas(lives, start, page.stream_names)
    placed = _place_sanitizer_findings(lives, sanitizer_findings)
    svg = canvas.draw(placed)
    notices = [page.notice] if page.notice else []
    if start:
        notices.append(f"Only the last {max_events} of {lives.end} trace events are drawn; the tables list everything.")
    return _PAGE.format(
        title=_e(page.title),
        source=_e(page.source),
        facts="".join(f"<tr><th>{_e(k)}</th><td>{_e(str(v))}</td></tr>" for k, v in page.facts),
        notices="".join(f'<p class="notice">{_e(n)}</p>' for n in notices),
        svg=svg,
        legend=_legend(),
        blocks=_blocks_table(lives),
        findings=_findings_table(lives, placed),
        storages=f"<h2>What the sanitizer saw</h2>\n{storages_html}" if storages_html else "",
    )


def _e(text: str) -> str:
    return html.escape(text, quote=True)


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:g} {unit}" if unit == "B" else f"{n:.4g} {unit}"
        n /= 1024
    return str(n)


def _place_sanitizer_findings(lives: Lives, findings: tuple) -> list:
    """(life or None, finding): each on the latest block life at its address."""
    placed = []
    for f in findings:
        at = [life for life in lives.blocks
              if f.address is not None and (life.device, life.ptr) == (f.device, f.address)]
        placed.append((at[-1] if at else None, f))
    return placed


class _Canvas:
    def __init__(self, lives: Lives, start: int, stream_names: dict) -> None:
        self.lives, self.start, self.stream_names = lives, start, stream_names
        steps = lives.end - start + 1
        self.step_w = max(6.0, min(40.0, 1000.0 / max(steps, 1)))
        self.width = LABEL_W + steps * self.step_w + 20
        self.lanes = lives.streams()
        self.rows = self._pack_rows()
        self.gaps = self._idle_gaps()
        self.axis_h = AXIS_H + (GAP_ROW_H if self.gaps else 0)
        self.lane_y, y = {}, self.axis_h
        for lane in self.lanes:
            self.lane_y[lane] = y
            y += MARK_ROW_H + max(1, self.rows_in_lane(lane)) * ROW_H + 10
        self.height = y + 10
        self.t0 = lives.t_ns(0) or 0
        self.out: list = []
        self.labels: list = []  # drawn last, over the marks

    # geometry
    def x(self, index: Optional[int]) -> float:
        index = self.lives.end if index is None else max(index, self.start)
        return LABEL_W + (index - self.start + 0.5) * self.step_w

    def bar_y(self, life: Life) -> float:
        return self.lane_y[(life.device, life.alloc_stream)] + MARK_ROW_H + self.rows[life.name] * ROW_H

    def mark_y(self, device: int, stream: int) -> float:
        return self.lane_y[(device, stream)] + MARK_ROW_H / 2

    def rows_in_lane(self, lane: tuple) -> int:
        rows = [self.rows[life.name] for life in self.lives.blocks if (life.device, life.alloc_stream) == lane]
        return max(rows, default=-1) + 1

    def _pack_rows(self) -> dict:
        """Greedy interval packing of the lives of each lane into rows."""
        rows: dict = {}
        ends: dict = {}  # lane -> [last occupied position per row]
        for life in sorted(self.lives.blocks, key=lambda lf: (lf.alloc if lf.alloc is not None else -1)):
            lane = (life.device, life.alloc_stream)
            begin = life.alloc if life.alloc is not None else -1
            finish = self._last(life)
            lane_ends = ends.setdefault(lane, [])
            row = next((r for r, end in enumerate(lane_ends) if end < begin), len(lane_ends))
            if row == len(lane_ends):
                lane_ends.append(finish)
            else:
                lane_ends[row] = finish
            rows[life.name] = row
        return rows

    def _last(self, life: Life) -> int:
        held = life.held_until(self.lives.end)
        ends = [life.free, held, *(m.index for m in life.marks)]
        if life.free is None:
            ends.append(self.lives.end)
        return max((e for e in ends if e is not None), default=self.lives.end)

    def when(self, index: Optional[int]) -> str:
        t = self.lives.t_ns(index)
        return "?" if t is None else f"+{(t - self.t0) / 1000:.1f} us"

    def _idle_gaps(self) -> list:
        """(index, idle ns): the steps from event index-1 to event index that
        took far longer than the usual step, the longest MAX_GAPS, in order."""
        t = [self.lives.t_ns(i) for i in range(self.start, self.lives.end)]
        steps = [(self.start + k + 1, b - a) for k, (a, b) in enumerate(zip(t, t[1:]))
                 if a is not None and b is not None]
        usual = statistics.median([d for _, d in steps if d > 0] or [0])
        gaps = [(i, d) for i, d in steps if d >= max(GAP_FACTOR * usual, GAP_MIN_NS)]
        return sorted(sorted(gaps, key=lambda g: -g[1])[:MAX_GAPS])

    # drawing
    def draw(self, placed: list) -> str:
        self._axis()
        for lane in self.lanes:
            self._lane(lane)
        self._gap_breaks()
        colours = {life.name: PALETTE[i % len(PALETTE)] for i, life in enumerate(self.lives.blocks)}
        for life in self.lives.blocks:
            if self._last(life) >= self.start:
                self._life(life, colours[life.name])
        for mark in self.lives.loose:
            if mark.index is not None and mark.index >= self.start and (0, mark.stream) in self.lane_y:
                self._symbol(mark.kind, self.x(mark.index), self.mark_y(0, mark.stream),
                             f"{describe(mark.kind, mark.stream, mark.text)} (address {mark.ptr:#x}, no block of the "
                             f"trace), {self.when(mark.index)}")
        for life, finding in placed:
            if life is not None and self._last(life) >= self.start:
                self._sanitizer_mark(life, finding)
        return (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width:.0f}" height="{self.height:.0f}" '
            f'font-family="sans-serif" font-size="11">{_DEFS}{"".join(self.out + self.labels)}</svg>'
        )

    def _axis(self) -> None:
        steps = self.lives.end - self.start
        every = max(1, round(steps / 12)) if steps else 1
        self.out.append('<text x="4" y="14" class="axis">trace order &#8594;</text>')
        if self.gaps:
            self.out.append(f'<text x="4" y="{AXIS_H + 6}" class="axis"><tspan class="gaplabel">//</tspan> an idle '
                            'gap in host time</text>')
        for i in range(self.start, self.lives.end, every):
            x = self.x(i)
            self.out.append(f'<line x1="{x:.1f}" y1="{self.axis_h - 6}" x2="{x:.1f}" y2="{self.height - 6}" '
                            'class="grid"/>')
            self.out.append(f'<text x="{x:.1f}" y="14" text-anchor="middle" class="axis">#{i}</text>')
            self.out.append(f'<text x="{x:.1f}" y="26" text-anchor="middle" class="axis">{self.when(i)}</text>')

    def _gap_breaks(self) -> None:
        """Each idle gap: a cut across every lane between its two events,
        edged by dashed lines, and the idle time under the axis."""
        last_label = -1e9
        for index, idle in self.gaps:
            xm = (self.x(index - 1) + self.x(index)) / 2
            tip = (f"idle gap: no trace event for {idle / 1000:.1f} us, from {self.when(index - 1)} (#{index - 1}) "
                   f"to {self.when(index)} (#{index}); the axis steps by event, not by time")
            top, bottom = AXIS_H - 4, self.height - 6
            parts = [f'<rect x="{xm - 2:.1f}" y="{top}" width="4" height="{bottom - top:.0f}" class="gapcut"/>']
            parts += [f'<line x1="{xm + dx:.1f}" y1="{top}" x2="{xm + dx:.1f}" y2="{bottom:.0f}" class="gap"/>'
                      for dx in (-2, 2)]
            if xm - last_label > 70:  # labels side by side would overlap: the tooltip still says it
                parts.append(f'<text x="{xm:.1f}" y="{AXIS_H + 6}" text-anchor="middle" class="gaplabel">'
                             f'idle {_duration(idle)}</text>')
                last_label = xm
            self.labels.append(f'<g><title>{_e(tip)}</title>{"".join(parts)}</g>')

    def _lane(self, lane: tuple) -> None:
        device, stream = lane
        y = self.lane_y[lane]
        h = MARK_ROW_H + max(1, self.rows_in_lane(lane)) * ROW_H
        self.out.append(f'<rect x="0" y="{y - 2}" width="{self.width:.0f}" height="{h + 4}" class="lane"/>')
        role = self.stream_names.get(stream)
        self.out.append(f'<text x="6" y="{y + 13}" class="lanename">{_e(stream_name(stream))}</text>')
        self.out.append(f'<text x="6" y="{y + 27}" class="lanesub">device {device}{", " + _e(role) if role else ""}'
                        '</text>')
        self.out.append(f'<line x1="{LABEL_W - 4}" y1="{y + MARK_ROW_H}" x2="{self.width:.0f}" '
                        f'y2="{y + MARK_ROW_H}" class="markrow"/>')

    def _life(self, life: Life, colour: str) -> None:
        y = self.bar_y(life) + 2
        h = ROW_H - 5
        x0 = self.x(life.alloc if life.alloc is not None else self.start) - self.step_w * 0.4
        x1 = self.x(life.free) if life.free is not None else self.x(None)
        held = life.held_until(self.lives.end)
        waited = ", ".join(f"{stream_name(s)} ({'/'.join(k)})" for s, k in life.waited_streams()) or "no other stream"
        tip = (f"{life.name}: {_size(life.size)} at {life.ptr:#x}, owner {life.generation} of the address, "
               f"allocated on {stream_name(life.alloc_stream)} "
               f"{self.when(life.alloc) if life.alloc is not None else 'before the trace'}, "
               f"{'freed ' + self.when(life.free) if life.free is not None else 'still live at the end'}; "
               f"its free waits for {waited}")
        self.out.append(f'<g><title>{_e(tip)}</title><rect x="{x0:.1f}" y="{y}" width="{max(x1 - x0, 2):.1f}" '
                        f'height="{h}" rx="3" fill="{colour}" class="life"/>')
        if life.alloc is None or life.alloc < self.start:
            self.out.append(f'<text x="{x0 + 2:.1f}" y="{y + 11}" class="cut">&#8249;</text>')
        label = f"{life.name} {_size(life.size)}"
        if x1 - x0 > 7 * len(label):
            self.labels.append(f'<text x="{x0 + 9:.1f}" y="{y + 11}" class="label">{_e(label)}</text>')
        elif x1 - x0 > 7 * len(life.name):
            self.labels.append(f'<text x="{x0 + 9:.1f}" y="{y + 11}" class="label">{_e(life.name)}</text>')
        if life.free is not None:
            self.out.append(f'<line x1="{x1:.1f}" y1="{y - 1}" x2="{x1:.1f}" y2="{y + h + 1}" class="free"/>')
        else:  # live at the end: an open end
            self.out.append(f'<path d="M{x1:.1f},{y - 1} l7,{h / 2 + 1} l-7,{h / 2 + 1} z" fill="{colour}" '
                            'class="life"/>')
        self.out.append("</g>")
        if held is not None:
            xh = self.x(held)
            state = "became reusable " + self.when(held) if life.reusable is not None else "still waiting at the end"
            tip = f"{life.name}: freed {self.when(life.free)}, waiting on events of {waited}; {state}"
            self.out.append(f'<g><title>{_e(tip)}'
                            f'</title><rect x="{x1:.1f}" y="{y}" width="{max(xh - x1, 2):.1f}" height="{h}" '
                            f'class="held"/></g>')
        if life.reusable is not None:
            xr = self.x(life.reusable)
            self.out.append(f'<g><title>{_e(f"{life.name}: reusable {self.when(life.reusable)}")}</title>'
                            f'<path d="M{xr:.1f},{y - 2} l4,-5 h-8 z M{xr:.1f},{y - 2} v{h + 4}" '
                            'class="reusable"/></g>')
        for mark in life.marks:
            if mark.index is not None and mark.index >= self.start:
                self._life_mark(life, mark, y + h / 2)

    def _life_mark(self, life: Life, mark: Mark, bar_mid: float) -> None:
        x = self.x(mark.index)
        tip = f"{life.name}: {describe(mark.kind, mark.stream, mark.text)}, {self.when(mark.index)}"
        own_lane = mark.stream == life.alloc_stream or mark.kind not in ("record_use", "record_stream", "erase_stream",
                                                                          "note_use", "finding")
        if own_lane or (life.device, mark.stream) not in self.lane_y:
            self._symbol(mark.kind, x, bar_mid, tip)
            return
        y = self.mark_y(life.device, mark.stream)
        self.out.append(f'<line x1="{x:.1f}" y1="{y:.1f}" x2="{x:.1f}" y2="{bar_mid:.1f}" class="tie {mark.kind}"/>')
        self.out.append(f'<circle cx="{x:.1f}" cy="{bar_mid:.1f}" r="2" class="tiedot"/>')
        self._symbol(mark.kind, x, y, tip)

    def _sanitizer_mark(self, life: Life, finding: SanitizerFinding) -> None:
        x = self.x(life.free if life.free is not None else None)
        y = self.bar_y(life) + ROW_H / 2
        tip = f"sanitizer on {life.name} (drawn at its free; the sanitizer gives no time): {finding.text}"
        self.out.append(f'<g><title>{_e(tip)}</title><rect x="{x - 6:.1f}" y="{y - 6:.1f}" width="12" height="12" '
                        f'transform="rotate(45 {x:.1f} {y:.1f})" class="sanitizer"/></g>')

    def _symbol(self, kind: str, x: float, y: float, tip: str) -> None:
        shape, colour, _ = SYMBOLS[kind]
        self.out.append(f"<g><title>{_e(tip)}</title>{_shape(shape, x, y, colour)}</g>")


def _duration(ns: int) -> str:
    if ns < 1_000_000:
        return f"{ns / 1000:.1f} us"
    if ns < 1_000_000_000:
        return f"{ns / 1e6:.4g} ms"
    return f"{ns / 1e9:.4g} s"


def _shape(shape: str, x: float, y: float, colour: str) -> str:
    if shape == "circle":
        return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="5" fill="{colour}"/>'
    if shape == "square":
        return f'<rect x="{x - 4.5:.1f}" y="{y - 4.5:.1f}" width="9" height="9" fill="{colour}"/>'
    if shape == "cross":
        return (f'<path d="M{x - 4:.1f},{y - 4:.1f} l8,8 M{x + 4:.1f},{y - 4:.1f} l-8,8" stroke="{colour}" '
                f'stroke-width="2.5"/>')
    if shape == "triangle":
        return f'<path d="M{x:.1f},{y - 6:.1f} l6,10 h-12 z" fill="{colour}"/>'
    if shape == "diamond":
        return f'<path d="M{x:.1f},{y - 6:.1f} l6,6 l-6,6 l-6,-6 z" fill="{colour}"/>'
    if shape == "bar":
        return f'<rect x="{x - 1.5:.1f}" y="{y - 7:.1f}" width="3" height="14" fill="{colour}"/>'
    return (f'<circle cx="{x:.1f}" cy="{y:.1f}" r="7" fill="{colour}"/><text x="{x:.1f}" y="{y + 4:.1f}" '
            f'text-anchor="middle" fill="white" font-weight="bold" font-size="11">!</text>')


def _legend() -> str:
    swatch = '<svg width="26" height="16">{}</svg>'
    items = [
        (swatch.format('<rect x="1" y="2" width="24" height="12" rx="3" fill="#9ecae1" stroke="#333"/>'),
         "a block, in the lane of its allocation stream, from its alloc to its free (dark edge)"),
        (swatch.format('<rect x="1" y="2" width="24" height="12" fill="url(#hatch)"/>'),
         "freed, not yet reusable: the free waits on events of other streams (or quarantine)"),
        (swatch.format('<path d="M13,4 l4,-4 h-8 z M13,4 v12" class="reusable"/>'), "the moment it became reusable"),
        (swatch.format('<line x1="13" y1="0" x2="13" y2="16" class="tie"/><circle cx="13" cy="13" r="2"/>'),
         "a call on another stream, tied to the block it names"),
    ]
    items += [(swatch.format(_shape(shape, 13, 8, colour)), text) for shape, colour, text in SYMBOLS.values()]
    items.append((swatch.format('<rect x="8" y="3" width="10" height="10" transform="rotate(45 13 8)" '
                                'class="sanitizer"/>'), "a lifetime-sanitizer finding, at the block's free"))
    items.append((swatch.format('<line x1="11.5" y1="0" x2="11.5" y2="16" class="gap"/><line x1="14.5" y1="0" '
                                'x2="14.5" y2="16" class="gap"/>'),
                  "an idle gap in host time between two events (the axis steps by event): the label gives its length"))
    body = "".join(f"<li>{sw} {_e(text)}</li>" for sw, text in items)
    return f'<ul class="legend">{body}</ul>'


def _blocks_table(lives: Lives) -> str:
    if not lives.blocks:
        return "<p>No block in the trace.</p>"
    t0 = lives.t_ns(0) or 0

    def at(index: Optional[int]) -> str:
        return "" if index is None else f"#{index} (+{(lives.t_ns(index) - t0) / 1000:.1f} us)"

    rows = []
    for life in lives.blocks:
        held = life.held_until(lives.end)
        wait = "" if held is None else f"{(lives.t_ns(held) - lives.t_ns(life.free)) / 1000:.1f} us"
        if held is not None and life.reusable is None:
            wait += " (still waiting)"
        streams = ", ".join(f"{stream_name(s)} ({'/'.join(k)})" for s, k in life.waited_streams())
        findings = "; ".join(m.text or "finding" for m in life.marks if m.kind == "finding")
        rows.append(
            f"<tr><td>{life.name}</td><td>{life.ptr:#x}</td><td>{life.generation}</td><td>{_size(life.size)}</td>"
            f"<td>{_e(stream_name(life.alloc_stream))}</td><td>{at(life.alloc) or 'before the trace'}</td>"
            f"<td>{_e(streams)}</td><td>{at(life.free)}</td><td>{wait}</td><td>{at(life.reusable)}</td>"
            f"<td>{life.state}</td><td class=\"bad\">{_e(findings)}</td></tr>"
        )
    head = ("<tr><th>block</th><th>address</th><th>owner #</th><th>size</th><th>allocated on</th><th>alloc</th>"
            "<th>its free waits for</th><th>free</th><th>waited</th><th>reusable</th><th>at the end</th>"
            "<th>shim findings</th></tr>")
    return f'<table class="data">{head}{"".join(rows)}</table>'


def _findings_table(lives: Lives, placed: list) -> str:
    rows = []
    for life, mark in lives.findings():
        where = life.name if life is not None else f"{mark.ptr:#x} (no block of the trace)"
        when = "not in the trace" if mark.index is None else f"#{mark.index}"
        rows.append(f"<tr><td>shim</td><td>{_e(where)}</td><td>{_e(stream_name(mark.stream))}</td><td>{when}</td>"
                    f"<td>{_e(mark.text or 'finding')}</td></tr>")
    for life, f in placed:
        where = life.name if life is not None else ("no block of the trace" if f.address is None
                                                     else f"{f.address:#x} (no block of the trace)")
        stream = "" if f.stream is None else stream_name(f.stream)
        rows.append(f"<tr><td>sanitizer</td><td>{_e(where)}</td><td>{_e(stream)}</td><td>at the block's free</td>"
                    f"<td><pre>{_e(f.text)}</pre></td></tr>")
    if not rows:
        return "<p>No findings.</p>"
    head = "<tr><th>from</th><th>block</th><th>stream</th><th>when</th><th>what</th></tr>"
    return f'<table class="data">{head}{"".join(rows)}</table>'


_DEFS = (
    '<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">'
    '<rect width="6" height="6" fill="#fde0c5"/><line x1="0" y1="0" x2="0" y2="6" stroke="#e6550d" '
    'stroke-width="2.5"/></pattern></defs>'
    "<style>.lane{fill:#f7f7f7}.lanename{font-weight:bold}.lanesub{fill:#777;font-size:10px}"
    ".markrow{stroke:#ddd;stroke-dasharray:2 2}.grid{stroke:#eee}.axis{fill:#666;font-size:10px}"
    ".life{stroke:#555;stroke-width:0.8}.held{fill:url(#hatch);stroke:#e6550d;stroke-width:0.8}"
    ".free{stroke:#222;stroke-width:2.5}.label{font-size:10px;fill:#111;stroke:white;stroke-width:3px;paint-order:stroke;pointer-events:none}.cut{font-size:12px;fill:#111}"
    ".reusable{fill:#2ca02c;stroke:#2ca02c;stroke-width:1.5}.tie{stroke:#555;stroke-dasharray:3 2}"
    ".tiedot{fill:#333}.sanitizer{fill:white;stroke:#d62728;stroke-width:2.5}"
    ".gap{stroke:#8c6d31;stroke-width:1.2;stroke-dasharray:5 3}.gapcut{fill:white}"
    ".gaplabel{fill:#8c6d31;font-size:10px;font-weight:bold;stroke:white;stroke-width:3px;paint-order:stroke}</style>"
)

_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body{{font-family:sans-serif;font-size:13px;margin:16px;color:#111}}
h1{{font-size:18px;margin:0 0 4px}} h2{{font-size:15px;margin:18px 0 6px}}
.facts th{{text-align:left;padding-right:10px;font-weight:normal;color:#555}}
.notice{{background:#fff4d6;border:1px solid #e0c060;padding:6px 10px}}
.picture{{overflow-x:auto;border:1px solid #ccc}}
.legend{{list-style:none;padding:0;columns:2;margin:6px 0}} .legend li{{margin:2px 0}}
.legend svg{{vertical-align:middle}}
table.data{{border-collapse:collapse}}
table.data td,table.data th{{border:1px solid #ccc;padding:2px 6px;text-align:left}}
table.data th{{background:#f0f0f0}} .bad{{color:#b00}} pre{{margin:0;white-space:pre-wrap}}
</style></head><body>
<h1>{title}</h1>
<p>{source}</p>
<table class="facts">{facts}</table>
{notices}
{storages}
<h2>Timeline</h2>
<p>One lane per stream; hover any shape for what happened and when (host time from the first event).</p>
<div class="picture">{svg}</div>
{legend}
<h2>Blocks</h2>
<p>One row per owner of an address. <i>its free waits for</i>: the streams whose events the free waited on
(record_use, record_stream, uses the sanitizer noted); <i>waited</i>: from the free until the block was
reusable; <i>at the end</i>: live (held by a tensor), held (freed, still waiting) or free.</p>
{blocks}
<h2>Findings</h2>
{findings}
</body></html>
"""
