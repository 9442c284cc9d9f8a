"""Each form of each case under the sanitizer, as ``npu-lifetime check``
runs a user's script (default settings: every race and every uncovered free
fails), and what the buggy form's report names."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Verdict:
    exit_code: int
    kinds: list  # the kinds of the findings that fail the check
    named: dict = field(default_factory=dict)  # producer, consumer, buffer, overwrite, fix: what the report says
    report: str = ""


def check_form(module, form: str, device: str) -> Verdict:
    from ..sanitizer.runner import check_script

    result = check_script(module.__file__, ["--device", device, "--form", form], device=device)
    failing = [entry for entry in result.json if entry.get("fails")]
    return Verdict(result.exit_code, sorted({entry["kind"] for entry in failing}),
                   _named(module.CASE.finding, failing), result.report)


def _named(kind: str, findings: list) -> dict:
    """What the report says of the case's own finding: the streams, the
    buffer, the op that reuses or overwrites the memory, and the fix."""
    main = next((f for f in findings if f["kind"] == kind), None)
    if main is None:
        return {}
    text = main.get("text", "")
    buffer = text.split("`")[1] if text.count("`") >= 2 and "` (storage" in text else ""
    if kind == "uncovered_free":
        reuse = next((f for f in findings if f["kind"] == "reuse_race"), None)
        overwrite = (f"{reuse['access']['op']} on {reuse['access']['stream']}" if reuse
                     else f"none seen (latent): freed at {_site(main.get('free_site'))}")
        named = {"producer": main["alloc_stream"], "consumer": main["usage_stream"], "overwrite": overwrite}
    else:
        writer, other = (main["prior"], main["access"]) if main["prior"]["access"] == "write" else \
            (main["access"], main["prior"])
        named = {"producer": writer["stream"], "consumer": other["stream"],
                 "overwrite": f"{writer['op']} on {writer['stream']}"}
    named.update(buffer=buffer, fix=_first_fix(text))
    return named


def _site(site) -> str:
    return f"{site[0]['file'].rsplit('/', 1)[-1]}:{site[0]['line']}" if site else "?"


def _first_fix(text: str) -> str:
    """The first fix the report offers (the record_use one where there is one):
    the line after its ``fix`` heading, with any continuation lines."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.lstrip().startswith("fix")), None)
    if start is None:
        return ""
    heading = lines[start].strip()
    if not heading.endswith(":"):  # one fix, on the heading's line
        return heading.partition(":")[2].strip()
    first = [lines[start + 1].strip()] if start + 1 < len(lines) else []
    for line in lines[start + 2:]:
        if not line.startswith("      "):  # the next option or the next field
            break
        first.append(line.strip())
    return " ".join(" ".join(first).split())


def names_ok(case, named: dict) -> bool:
    """The report names the case's producer and consumer streams and its buffer."""
    return bool(named) and case.producer in named["producer"] and case.consumer in named["consumer"] \
        and (not case.buffer or named["buffer"] == case.buffer) and bool(named["fix"])
