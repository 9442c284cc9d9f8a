"""Reading ``npu-lifetime handoff``'s table back (for the tests that run
the command on a real device: tests/platforms/test_npu_handoff.py, test_gpu_handoff.py)."""
import re

CORRECT = ("record_stream", "recipe", "record_use", "inefficient: consumer event recorded late")
BROKEN = ("broken: drop outside the owner stream context", "broken: stash dropped too early",
          "broken: record_use before the last read")
ROW = re.compile(r"^(?P<handoff>\S.*?)\s{2,}(?P<policy>poll|stream_wait|lazy_wait)\s+(?P<findings>.+?)\s+\d+\s+"
                 r"(?:[\d.]+ \([\d.]+-[\d.]+\)|-)"  # step ms: median (fastest-slowest)
                 r"\s+(?P<outputs>same|DIFFER)\s+(?P<late>corrupts|safe)\s+(?P<debug>poison|data|other|-)\s+"
                 r"(?P<verdict>ok|UNEXPECTED):")


def rows_by_handoff(out: str) -> dict:
    """hand-off name -> its rows (dicts of the columns), from the command's stdout."""
    by_name: dict = {}
    for match in map(ROW.match, out.splitlines()):
        if match:
            by_name.setdefault(match["handoff"], []).append(match.groupdict())
    return by_name


def assert_device_table(out: str, device: str) -> None:
    """The table of ``handoff --device DEVICE``: the broken rows reported and
    their last reads on the device seeing their buffers freed under them
    (the poison), the correct ones clean with their data."""
    assert f"device {device}" in out and "debug: what the device itself did" in out, out
    assert f"torch.{device}._sleep" in out, out
    by_name = rows_by_handoff(out)
    assert set(by_name) == set(CORRECT + BROKEN), out
    assert {r["policy"] for r in by_name["record_use"]} == {"poll", "stream_wait", "lazy_wait"}
    for name in BROKEN:
        for row in by_name[name]:
            assert row["debug"] == "poison", row  # the device's late read saw its buffer freed under it
            assert "uncovered_free" in row["findings"] and row["verdict"] == "ok", row
    for name in CORRECT:
        for row in by_name[name]:
            assert row["debug"] == "data" and row["outputs"] == "same", row  # intact on the device
            assert row["findings"] == "-" and row["verdict"] == "ok", row
    assert "as expected" in out and f"on the {device} itself" in out and "UNEXPECTED" not in out
