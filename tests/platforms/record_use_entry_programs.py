"""record_use's C entry against the Python reference on a real device, each
program in a fresh process: under the shim (ShimFast) and over the device's
own allocator (FallbackFast).  DEVICE is cuda (a GPU) or npu (the real
torch_npu over the stand-in CANN runtime, or CANN itself).  The last stdout
line is JSON.

    python tests/platforms/record_use_entry_programs.py DEVICE PROGRAM
"""
import json
import re
import sys

import torch

if sys.argv[1:2] == ["npu"]:
    import torch_npu  # noqa: F401  (registers torch.npu, before npu_lifetime looks for it)

import npu_lifetime
from npu_lifetime.recording import calls


def outcome(call):
    try:
        call()
    except Exception as err:  # noqa: BLE001 - the outcome compared is the error itself
        return [type(err).__name__, re.sub(r"0x[0-9a-f]+", "0x?", str(err))]
    return ["done"]


def inputs(device: str):
    """(name, tensor maker, stream maker); the stream makers take the owner stream."""
    accel = getattr(torch, device)
    cases = [
        ("explicit side stream", lambda: torch.ones(256, device=device), lambda owner: accel.Stream()),
        ("a view", lambda: torch.ones(256, device=device)[8:16], lambda owner: accel.Stream()),
        ("the allocation stream", lambda: torch.ones(256, device=device), lambda owner: owner),
        ("current stream (None)", lambda: torch.ones(256, device=device), lambda owner: None),
        ("a CPU tensor", lambda: torch.ones(4), lambda owner: accel.Stream()),
        ("not a stream", lambda: torch.ones(256, device=device), lambda owner: "side"),
    ]
    if device == "cuda":  # cases only the CUDA instance has been run with
        cases.append(("a generic torch.Stream", lambda: torch.ones(256, device="cuda"),
                      lambda owner: torch.Stream(stream_id=torch.cuda.Stream().stream_id, device_index=0,
                                                 device_type=1)))
        if torch.cuda.device_count() > 1:
            cases.append(("a stream of another device", lambda: torch.ones(256, device="cuda"),
                          lambda owner: torch.cuda.Stream(device=1)))
    return cases


def compare(device: str, reference_fast) -> dict:
    """{case: [C entry's outcome, reference's outcome]}; the reference runs
    with ``reference_fast()`` as the active fast path."""
    accel = getattr(torch, device)
    out = {}
    for name, make_tensor, make_stream in inputs(device):
        row = []
        for native in (True, False):
            owner = accel.current_stream()
            tensor, stream = make_tensor(), make_stream(owner)
            c_fast = calls._fast
            if not native:
                calls._fast = reference_fast()
            try:
                with accel.stream(accel.Stream()):
                    entry = calls.record_use if native else calls.record_use_reference
                    row.append(outcome(lambda: entry(tensor, stream)))  # noqa: B023 - called at once
            finally:
                calls._fast = c_fast
        out[name] = row
    accel.synchronize()
    return out


def enable_fast_path(device: str) -> None:
    npu_lifetime.record_use(torch.ones(4, device=device), getattr(torch, device).Stream())


def entry_taken(device: str, reference_fast) -> dict:
    return {"entry": type(calls.record_use).__name__, "fast": type(calls._fast).__name__,
            "outcomes": compare(device, reference_fast)}


def shim_entry(device: str) -> dict:
    npu_lifetime.install(device)
    enable_fast_path(device)
    return entry_taken(device, calls._routes[device].make_fast_reference)


def fallback_entry(device: str) -> dict:
    enable_fast_path(device)
    table_fast = calls.FALLBACK.for_device(device).fast
    current_stream = getattr(torch, device).current_stream
    return entry_taken(device, lambda: calls.fallback_fast_path_reference(table_fast, f"is_{device}", current_stream))


PROGRAMS = {"shim_entry": shim_entry, "fallback_entry": fallback_entry}

if __name__ == "__main__":
    device, program = sys.argv[1:]
    print(json.dumps(PROGRAMS[program](device)))
