"""The HTML timeline drawn from the hand-written trace in viz_fixture."""
import re
import xml.etree.ElementTree as ET

import pytest
from helpers import viz_fixture as fx

from npu_lifetime.viz import lives, timeline

SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture
def page():
    built = lives.build(fx.trace(), fx.findings())
    sanitizer = (timeline.SanitizerFinding("[uncovered free] storage of b3", fx.D, 0, fx.M),
                 timeline.SanitizerFinding("[data race] somewhere else", None))
    html = timeline.render(built, timeline.Page(source="the fixture", facts=[("runtime", "sim")]), sanitizer)
    picture = re.search(r'<div class="picture">(<svg.*?</svg>)</div>', html, re.S).group(1)
    return built, html, ET.fromstring(picture)


def titled(svg, start):
    """The <g> groups whose tooltip starts with ``start``."""
    return [g for g in svg.iter(f"{SVG}g") if (g.findtext(f"{SVG}title") or "").startswith(start)]


def x_of(canvas_svg, index):
    """Where the picture puts trace position ``index`` (the centre of its step)."""
    width = float(canvas_svg.get("width"))
    steps = len(fx.trace()) + 1
    step = (width - timeline.LABEL_W - 20) / steps
    return timeline.LABEL_W + (index + 0.5) * step


def test_self_contained_page(page):
    _, html, _ = page
    assert "<script" not in html and "http://" not in html.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in html


def test_one_lane_per_stream(page):
    _, _, svg = page
    lanes = [t.text for t in svg.iter(f"{SVG}text") if t.get("class") == "lanename"]
    assert lanes == ["stream 0x10", "stream 0x20", "stream 0x30"]


def test_every_block_is_a_bar_with_its_story_in_the_tooltip(page):
    built, _, svg = page
    for life in built.blocks:
        (group,) = titled(svg, f"{life.name}: 256 KiB at {life.ptr:#x}")
        assert group.find(f"{SVG}rect").get("class") == "life"
    (b2,) = titled(svg, "b2: 256 KiB")
    assert "still live at the end" in b2.findtext(f"{SVG}title")
    assert "stream 0x20 (record_stream), stream 0x30 (record_stream)" in b2.findtext(f"{SVG}title")


def test_pending_windows_are_shaded_from_the_free_to_the_moment_it_became_reusable(page):
    _, _, svg = page
    held = [g for g in svg.iter(f"{SVG}g") if g.find(f"{SVG}rect") is not None
            and g.find(f"{SVG}rect").get("class") == "held"]
    assert [g.findtext(f"{SVG}title").split(":")[0] for g in held] == ["b1", "b3"]
    b1 = held[0].find(f"{SVG}rect")
    left, right = float(b1.get("x")), float(b1.get("x")) + float(b1.get("width"))
    assert left == pytest.approx(x_of(svg, 5), abs=0.2) and right == pytest.approx(x_of(svg, 9), abs=0.2)
    assert "became reusable +9.0 us" in held[0].findtext(f"{SVG}title")
    assert "still waiting at the end" in held[1].findtext(f"{SVG}title")
    assert len(titled(svg, "b1: reusable +9.0 us")) == 1


def test_calls_on_other_streams_sit_in_those_lanes(page):
    _, _, svg = page
    (use,) = titled(svg, "b1: record_use on stream 0x20")
    circle = use.find(f"{SVG}circle")
    lane_20 = next(t for t in svg.iter(f"{SVG}text") if t.text == "stream 0x20")
    assert abs(float(circle.get("cy")) - (float(lane_20.get("y")) - 13 + timeline.MARK_ROW_H / 2)) < 0.1
    assert float(circle.get("cx")) == pytest.approx(x_of(svg, 2), abs=0.2)


def test_findings_are_marked(page):
    _, html, svg = page
    assert len(titled(svg, "b3: finding on stream 0x20: unrecorded_use (free)")) == 1
    assert len(titled(svg, "b5: finding on stream 0x10: double_free (free)")) == 1
    assert len(titled(svg, "finding on stream 0x10: unknown_pointer (free)")) == 1
    (sanitizer,) = titled(svg, "sanitizer on b3")
    assert sanitizer.find(f"{SVG}rect").get("class") == "sanitizer"
    assert "[data race] somewhere else" in html  # tied to no block: in the table only


def test_tables_list_blocks_and_findings(page):
    _, html, _ = page
    assert html.count("<tr><td>b") == 5
    assert "<td>4.0 us</td>" in html and "13.0 us (still waiting)" in html
    assert html.count("<tr><td>shim</td>") == 3 and html.count("<tr><td>sanitizer</td>") == 2


def test_an_empty_trace_says_why():
    html = timeline.render(lives.build([]), timeline.Page(notice="nothing was allocated through the shim"))
    assert "nothing was allocated through the shim" in html and "No block in the trace." in html


def test_only_the_latest_events_are_drawn_when_asked():
    built = lives.build(fx.trace(), fx.findings())
    html = timeline.render(built, timeline.Page(), max_events=5)
    assert f"Only the last 5 of {len(fx.trace())} trace events are drawn" in html
    svg = ET.fromstring(re.search(r'<div class="picture">(<svg.*?</svg>)</div>', html, re.S).group(1))
    assert not titled(svg, "b1: 256 KiB")  # over before the window
    assert titled(svg, "b2: 256 KiB") and html.count("<tr><td>b") == 5


def _with_idle_gap(at: int, gap_ns: int) -> list:
    """The fixture's trace (one event per microsecond) with ``gap_ns``
    between event ``at - 1`` and event ``at``."""
    return [{**e, "t_ns": e["t_ns"] + (gap_ns - 1000 if i >= at else 0)} for i, e in enumerate(fx.trace())]


def _svg(html):
    return ET.fromstring(re.search(r'<div class="picture">(<svg.*?</svg>)</div>', html, re.S).group(1))


def test_an_idle_gap_is_a_labelled_break_on_the_time_axis():
    # the axis steps one event at a time: a jump from +3.0 us to +6859.0 us in one step was not marked at all
    html = timeline.render(lives.build(_with_idle_gap(4, 6_856_000), fx.findings()), timeline.Page())
    svg = _svg(html)
    (gap,) = titled(svg, "idle gap")
    assert gap.findtext(f"{SVG}title") == ("idle gap: no trace event for 6856.0 us, from +3.0 us (#3) to +6859.0 us "
                                           "(#4); the axis steps by event, not by time")
    assert [t.text for t in gap.iter(f"{SVG}text")] == ["idle 6.856 ms"]
    breaks = [float(line.get("x1")) for line in gap.iter(f"{SVG}line")]
    assert breaks and all(x_of(svg, 3) < x < x_of(svg, 4) for x in breaks)  # between the two events
    assert float(gap.find(f"{SVG}line").get("y2")) > float(svg.get("height")) - 20  # across every lane
    assert "idle gap in host time" in html  # the axis and the legend say what the break is


def test_even_steps_have_no_break():
    svg = _svg(timeline.render(lives.build(fx.trace(), fx.findings()), timeline.Page()))
    assert not titled(svg, "idle gap")


def test_only_gaps_far_beyond_the_usual_step_break_the_axis():
    built = lives.build(_with_idle_gap(4, 10_000), fx.findings())  # 10 us where a step is 1 us: not idle
    assert not titled(_svg(timeline.render(built, timeline.Page())), "idle gap")
    built = lives.build(_with_idle_gap(4, 150_000), fx.findings())  # 150x the usual step, and over 100 us
    (gap,) = titled(_svg(timeline.render(built, timeline.Page())), "idle gap")
    assert [t.text for t in gap.iter(f"{SVG}text")] == ["idle 150.0 us"]
