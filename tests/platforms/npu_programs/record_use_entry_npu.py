"""record_use's C entry on the real torch_npu over the stand-in CANN runtime
(or CANN itself), against the Python reference: under the shim through the
NPU bridge (ShimFast) and over torch_npu's own allocator (FallbackFast).
The last stdout line is JSON."""
import json
import re
import sys

import torch
import torch_npu  # noqa: F401  (registers torch.npu)

import npu_lifetime
from npu_lifetime.recording import calls


def outcome(call):
    try:
        call()
    except Exception as err:  # noqa: BLE001 - the outcome compared is the error itself
        return [type(err).__name__, re.sub(r"0x[0-9a-f]+", "0x?", str(err))]
    return ["done"]


def inputs():
    """(name, tensor maker, stream maker); the stream makers take the owner stream."""
    return [
        ("explicit side stream", lambda: torch.ones(256, device="npu"), lambda owner: torch.npu.Stream()),
        ("a view", lambda: torch.ones(256, device="npu")[8:16], lambda owner: torch.npu.Stream()),
        ("the allocation stream", lambda: torch.ones(256, device="npu"), lambda owner: owner),
        ("current stream (None)", lambda: torch.ones(256, device="npu"), lambda owner: None),
        ("a CPU tensor", lambda: torch.ones(4), lambda owner: torch.npu.Stream()),
        ("not a stream", lambda: torch.ones(256, device="npu"), lambda owner: "side"),
    ]


def compare(reference_fast) -> dict:
    out = {}
    for name, make_tensor, make_stream in inputs():
        row = []
        for native in (True, False):
            owner = torch.npu.current_stream()
            tensor, stream = make_tensor(), make_stream(owner)
            c_fast = calls._fast
            if not native:
                calls._fast = reference_fast()
            try:
                with torch.npu.stream(torch.npu.Stream()):
                    entry = calls.record_use if native else calls.record_use_reference
                    row.append(outcome(lambda: entry(tensor, stream)))  # noqa: B023 - called at once
            finally:
                calls._fast = c_fast
        out[name] = row
    torch.npu.synchronize()
    return out


def shim_entry() -> dict:
    npu_lifetime.install("npu")
    npu_lifetime.record_use(torch.ones(4, device="npu"), torch.npu.Stream())  # enables the fast path
    route = calls._routes["npu"]
    return {"entry": type(calls.record_use).__name__, "fast": type(calls._fast).__name__,
            "outcomes": compare(route.make_fast_reference)}


def fallback_entry() -> dict:
    npu_lifetime.record_use(torch.ones(4, device="npu"), torch.npu.Stream())  # enables the fast path
    table_fast = calls.FALLBACK.for_device("npu").fast
    return {"entry": type(calls.record_use).__name__, "fast": type(calls._fast).__name__,
            "outcomes": compare(lambda: calls.fallback_fast_path_reference(
                table_fast, "is_npu", torch.npu.current_stream))}


PROGRAMS = {"shim_entry": shim_entry, "fallback_entry": fallback_entry}

if __name__ == "__main__":
    print(json.dumps(PROGRAMS[sys.argv[1]](*sys.argv[2:])))
