"""``npu-lifetime handoff``: every hand-off of the harness on one device,
as a table of findings, peak memory and output agreement."""
from __future__ import annotations

import torch

from ..shim import api as shim
from .harness import run_handoff
from .recipes import BROKEN, CORRECT, RecordStreamHandoff, RecordUseHandoff

POLICIES = {RecordStreamHandoff: ("poll", "stream_wait"), RecordUseHandoff: ("poll", "stream_wait")}


def handoff_table(device, layers: int = 6, width: int = 64) -> tuple:
    """Returns (rows, ok): ok when every correct hand-off is clean and agrees
    with the recipe's outputs, and every broken one is reported or, for the
    over-reserving variant, safe."""
    rows, reference, ok = [], None, True
    for cls in CORRECT + BROKEN:
        for policy in POLICIES.get(cls, ("poll",)):
            if device.name == "sim":
                shim.reset()
                shim.select_runtime("sim")
            shim.set_policy(policy)
            r = run_handoff(device, cls, layers=layers, width=width)
            reference = reference or r.outputs
            same = all(torch.equal(a, b) for a, b in zip(r.outputs, reference))
            expected_clean = cls in CORRECT or cls.__name__ == "BrokenEventTooLate"
            ok &= same and (not r.findings) == expected_clean
            rows.append((r.handoff, policy, ", ".join(r.finding_kinds) or "-", r.peak_active_bytes, same))
    return rows, ok


def format_table(rows: list) -> str:
    lines = [f"{'hand-off':<48} {'policy':<12} {'findings':<16} {'peak KiB':>9} {'outputs':>8}"]
    for name, policy, findings, peak, same in rows:
        lines.append(f"{name:<48} {policy:<12} {findings:<16} {peak / 1024:>9.0f} {'same' if same else 'DIFFER':>8}")
    return "\n".join(lines)
