"""record_use's C entry on CUDA against the Python reference, each program
in a fresh process: under the shim (ShimFast) and over the native fallback
(FallbackFast).  The last stdout line is JSON."""
import json
import re
import sys

import torch

import npu_lifetime
from npu_lifetime.recording import calls


def outcome(call):
    try:
        call()
    except Exception as err:  # noqa: BLE001 - the outcome compared is the error itself
        return [type(err).__name__, re.sub(r"0x[0-9a-f]+", "0x?", str(err))]
    return ["done"]


def inputs():
    """(name, tensor maker, stream maker); the makers take the owner stream."""
    cases = [
        ("explicit side stream", lambda: torch.ones(256, device="cuda"), lambda owner: torch.cuda.Stream()),
        ("a view", lambda: torch.ones(256, device="cuda")[8:16], lambda owner: torch.cuda.Stream()),
        ("the allocation stream", lambda: torch.ones(256, device="cuda"), lambda owner: owner),
        ("current stream (None)", lambda: torch.ones(256, device="cuda"), lambda owner: None),
        ("a CPU tensor", lambda: torch.ones(4), lambda owner: torch.cuda.Stream()),
        ("not a stream", lambda: torch.ones(256, device="cuda"), lambda owner: "side"),
        ("a generic torch.Stream", lambda: torch.ones(256, device="cuda"),
         lambda owner: torch.Stream(stream_id=torch.cuda.Stream().stream_id, device_index=0, device_type=1)),
    ]
    if torch.cuda.device_count() > 1:
        cases.append(("a stream of another device", lambda: torch.ones(256, device="cuda"),
                      lambda owner: torch.cuda.Stream(device=1)))
    return cases


def compare(reference_fast) -> dict:
    """{case: [C entry's outcome, reference's outcome]}; the reference runs
    with ``reference_fast()`` as the active fast path."""
    out = {}
    for name, make_tensor, make_stream in inputs():
        row = []
        for native in (True, False):
            owner = torch.cuda.current_stream()
            tensor, stream = make_tensor(), make_stream(owner)
            c_fast = calls._fast
            if not native:
                calls._fast = reference_fast()
            try:
                with torch.cuda.stream(torch.cuda.Stream()):
                    row.append(outcome(lambda: (calls.record_use if native else calls.record_use_reference)(
                        tensor, stream)))
            finally:
                calls._fast = c_fast
        out[name] = row
    torch.cuda.synchronize()
    return out


def shim_entry() -> dict:
    npu_lifetime.install("cuda")
    npu_lifetime.record_use(torch.ones(4, device="cuda"), torch.cuda.Stream())  # enables the fast path
    route = calls._routes["cuda"]
    return {"entry": type(calls.record_use).__name__, "fast": type(calls._fast).__name__,
            "outcomes": compare(route.make_fast_reference)}


def fallback_entry() -> dict:
    npu_lifetime.record_use(torch.ones(4, device="cuda"), torch.cuda.Stream())  # enables the fast path
    table_fast = calls.FALLBACK.for_device("cuda").fast
    return {"entry": type(calls.record_use).__name__, "fast": type(calls._fast).__name__,
            "outcomes": compare(lambda: calls.fallback_fast_path_reference(
                table_fast, "is_cuda", torch.cuda.current_stream))}


PROGRAMS = {"shim_entry": shim_entry, "fallback_entry": fallback_entry}

if __name__ == "__main__":
    print(json.dumps(PROGRAMS[sys.argv[1]](*sys.argv[2:])))
