"""``snapshot --sanitize`` on the simulated device draws what the sanitizer
saw of each storage it reported on (issue 38, item 9): the shim allocates no
CPU tensor, so the block timeline alone was empty ("No block in the trace")."""
import re
import textwrap
import xml.etree.ElementTree as ET

from npu_lifetime.cli import main
from helpers.scripts import forgotten_handoff, write_script

SVG = "{http://www.w3.org/2000/svg}"


def _storages_svg(html: str) -> ET.Element:
    section = html.split("<h2>What the sanitizer saw</h2>", 1)[1]
    return ET.fromstring(re.search(r"<svg .*?</svg>", section, re.S).group(0))


def _lanes(svg: ET.Element) -> dict:
    """lane name -> (top, bottom)."""
    rects = [r for r in svg.iter(f"{SVG}rect") if r.get("class") == "lane"]
    names = [t.text for t in svg.iter(f"{SVG}text") if t.get("class") == "lanename"]
    return {n: (float(r.get("y")), float(r.get("y")) + float(r.get("height"))) for n, r in zip(names, rects)}


def _in(lane: tuple, y: float) -> bool:
    return lane[0] <= y <= lane[1]


def test_the_finding_is_drawn_on_the_storages_lifeline_with_both_streams(tmp_path, capsys, sim_shim):
    path = write_script(tmp_path, forgotten_handoff())
    assert main(["snapshot", "--device", "sim", "--sanitize", path]) == 1
    capsys.readouterr()
    html = (tmp_path / "prog.snapshot.html").read_text()
    svg = _storages_svg(html)
    titles = [t.text for t in svg.iter(f"{SVG}text") if t.get("class") == "title"]
    assert len(titles) == 1 and titles[0].startswith("`x` (storage 0x"), titles
    lanes = _lanes(svg)
    # both streams, by the program's names (a simulated stream's number depends on the streams made before)
    assert len(lanes) == 2 and list(lanes)[0] == "sim default stream", list(lanes)
    assert re.fullmatch(r"sim stream \d+ \(`side`\)", list(lanes)[1]), list(lanes)
    default, side = lanes.values()

    (life,) = [r for r in svg.iter(f"{SVG}rect") if r.get("class") == "life"]
    assert _in(default, float(life.get("y")))  # the lifeline, in its allocation stream's lane
    start, end = float(life.get("x")), float(life.get("x")) + float(life.get("width"))

    marks = {g.find(f"{SVG}text").text: g for g in svg.iter(f"{SVG}g")}
    alloc, use, free = marks["allocated"], marks["last read: aten::mul"], marks["freed"]
    # forgotten_handoff's lines: x made at 7, read at 10, freed at 12
    assert "prog.py:7" in alloc.find(f"{SVG}title").text and "prog.py:10" in use.find(f"{SVG}title").text
    assert "prog.py:12" in free.find(f"{SVG}title").text
    use_dot = use.find(f"{SVG}circle")
    assert _in(side, float(use_dot.get("cy"))) and start < float(use_dot.get("cx")) < end  # the read on side

    (finding,) = [g for g in svg.iter(f"{SVG}g") if g.get("class") == "finding"]
    assert finding.find(f"{SVG}title").text.startswith("[uncovered free, latent] `x`")
    assert "npu_lifetime.record_use(x, side)" in finding.find(f"{SVG}title").text  # its report, with the fix
    diamond = finding.find(f"{SVG}rect")
    centre_x = float(diamond.get("x")) + float(diamond.get("width")) / 2
    centre_y = float(diamond.get("y")) + float(diamond.get("height")) / 2
    free_dot = free.find(f"{SVG}circle")
    assert (centre_x, centre_y) == (end, float(free_dot.get("cy")))  # on the lifeline's end: the free
    assert _in(default, centre_y)
    assert "the storages the sanitizer reported on are drawn" in html


def test_a_clean_script_says_there_is_nothing_to_draw(tmp_path, capsys, sim_shim):
    path = write_script(tmp_path, forgotten_handoff("npu_lifetime.record_use(x, side)"), "clean.py")
    assert main(["snapshot", "--device", "sim", "--sanitize", path]) == 0
    capsys.readouterr()
    html = (tmp_path / "clean.snapshot.html").read_text()
    assert "The sanitizer reported nothing: no storage to draw." in html


def test_a_reuse_race_draws_both_owners(tmp_path, capsys, sim_shim):
    from helpers.scripts import REUSED  # an actual reuse race on the simulated device

    path = tmp_path / "reused.py"
    path.write_text(textwrap.dedent(REUSED))
    assert main(["snapshot", "--device", "sim", "--sanitize", str(path)]) == 1
    capsys.readouterr()
    svg = _storages_svg((tmp_path / "reused.snapshot.html").read_text())
    labels = [t.text for g in svg.iter(f"{SVG}g") if g.get("class") == "finding" for t in g.iter(f"{SVG}text")]
    assert sorted(labels) == ["reuse race", "uncovered free (actual)"]
