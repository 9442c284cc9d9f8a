"""One corpus case: a publicly reported cross-stream bug, reproduced as a
small program with its buggy form and its fixed forms.

A case module holds ``CASE`` (what the bug is, where it was reported, what
the sanitizer must say about it) and ``program(dev, form)``, which runs one
form on a ``CorpusDevice`` and says whether its output came out intact.
Each case module is also a script (``python -m npu_lifetime.corpus.cases.X
--device sim --form buggy``), so ``npu-lifetime check`` runs it exactly as
it runs a user's script.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from typing import Callable

FORMS = ("buggy", "upstream", "record_use")


def buggy_forms(case) -> tuple:
    """The forms that keep the bug."""
    return ("buggy", *case.also_buggy)


@dataclass(frozen=True)
class Case:
    name: str
    threads: tuple  # "owner/repo#N": the public reports it reproduces
    summary: str  # one line: what went wrong
    finding: str  # what the buggy form is reported as: "uncovered_free" or "data_race"
    # What the buggy form's report must name (substrings of its finding):
    # the stream that produced the data, the one that consumed it, and the
    # variable whose memory is reused or overwritten.
    producer: str
    consumer: str
    buffer: str
    forms: tuple = FORMS  # the forms it has; record_use has none where no free is involved
    devices: tuple = ("sim", "cuda", "npu")
    # A bug the sanitizer cannot see: why (the buggy form is then expected to pass the check).
    gap: str = ""
    # Other forms that keep the bug and must be caught, as the buggy form must
    # be (a known gap's buggy form with the access declared: "declared").
    also_buggy: tuple = ()
    notes: dict = field(default_factory=dict)  # form -> why a form is missing or differs


def main(case: Case, program: Callable) -> None:
    """Runs one form: ``--device``, ``--form``; ``--slow`` makes one kernel
    slow so a race shows in the data; ``--result F`` writes whether the
    output came out intact."""
    from .device import DEVICES, CorpusDevice

    parser = argparse.ArgumentParser(description=f"{case.name}: {case.summary}")
    parser.add_argument("--device", choices=DEVICES, default="sim")
    parser.add_argument("--form", choices=case.forms, default="buggy")
    parser.add_argument("--slow", action="store_true")
    parser.add_argument("--result")
    args = parser.parse_args()
    dev = CorpusDevice(args.device, slow=args.slow)
    intact = bool(program(dev, args.form))
    dev.synchronize()
    if args.result:
        with open(args.result, "w") as out:
            json.dump({"intact": intact}, out)
    print(f"{case.name} [{args.form}] on {args.device}: output {'intact' if intact else 'CORRUPTED'}")
