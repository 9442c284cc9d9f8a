#!/usr/bin/env python3
"""Splits sampler.c's raw stacks of a sanitizer run into where the time went,
by library: no symbols needed, so it runs anywhere on stacks fetched from the
GPU host.

    python3 benchmarks/profile/breakdown.py stacks.txt [--op-call LIB@0xOFFSET]

Each sample goes to the innermost of these it passed through: the storage
feed (`_storage_feed`, the shim's `_hook_relay`), the device-event hook
(`_event_hook`, `_host_lock`), the trace hook (`_trace_hook`), the model
(`_native_model`), the native dispatch path (`_dispatch`, `_scan`, `_frames`,
`_feed`), the shim (`libnpl`), the CUDA libraries, torch's mode dispatch;
else "torch and Python" (the program, the op's own work, the interpreter).
--op-call names the dispatch path's frame that calls the op (a return address
in `_dispatch`, build-specific: read it off the symbolized profile, the frame
under `run_op`): samples under it that reach none of our other libraries are
then counted as "the op, called by the sanitizer".
"""
from __future__ import annotations

import argparse
import collections
from pathlib import Path

from symbolize import read_stacks  # this script's folder is on the path when it runs

RULES = (
    ("storage feed (allocations, frees)", ("_storage_feed", "_hook_relay")),
    ("device-event hook", ("_event_hook", "_host_lock")),
    ("trace hook", ("_trace_hook",)),
    ("lifetime model", ("_native_model",)),
    ("native dispatch path", ("_dispatch.", "_scan.", "_frames.", "_feed.")),
    ("shim", ("libnpl",)),
    ("CUDA libraries", ("libcuda.", "libcudart", "libcublas")),
    ("torch's mode dispatch", ("handle_torch_function", "pythonTLSSnapshot")),
)
OURS = tuple(key for _, keys in RULES[:6] for key in keys)


def category(frames: list, op_call: str | None) -> str:
    if op_call:
        under = [i for i, frame in enumerate(frames) if frame.startswith(op_call) or f"/{op_call}" in frame]
        if under and not any(key in frame for frame in frames[under[-1] + 1:] for key in OURS):
            return "the op, called by the sanitizer"
    for frame in reversed(frames):
        for name, keys in RULES:
            if any(key in frame for key in keys):
                return name
    return "torch and Python"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stacks", type=Path, nargs="+")
    parser.add_argument("--op-call", help="LIB@0xOFFSET of the dispatch path's call of the op, e.g. _dispatch.cpython-312-x86_64-linux-gnu.so@0x372f")
    args = parser.parse_args()
    for path in args.stacks:
        tally, total = collections.Counter(), 0
        for frames, count in read_stacks(path):
            tally[category(frames, args.op_call)] += count
            total += count
        print(f"{path}: {total} samples")
        for name, count in tally.most_common():
            print(f"  {count:6d}  {100 * count / total:5.1f}%  {name}")


if __name__ == "__main__":
    main()
