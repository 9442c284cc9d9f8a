#!/usr/bin/env python3
"""Names and tallies the stacks sampler.c wrote (run it on the machine that
sampled: it reads the same library files).

    python3 benchmarks/profile/symbolize.py stacks.txt [--top 40] [--within NAME]

Each frame is named with addr2line from its library's symbol table (static
functions of our extensions and of a statically linked interpreter included:
dladdr's nearest dynamic symbol would misname those); where addr2line knows
none, the dynamic symbol the sampler saw, demangled with c++filt.
Prints each function's inclusive and own share of the samples, and
--within keeps only samples under a frame whose name contains NAME.
"""
from __future__ import annotations

import argparse
import collections
import subprocess
from pathlib import Path


def read_stacks(path: Path) -> list:
    """sampler.c's file as (frames, count) pairs, root first."""
    stacks = []
    for line in path.read_text().splitlines():
        frames, _, count = line.rpartition(" ")
        if frames:
            stacks.append((frames.split(";"), int(count)))
    return stacks


def _split(frame: str) -> tuple:
    lib, _, rest = frame.partition("@")
    offset, _, symbol = rest.partition(":")
    return lib, offset, symbol


def _names(stacks: list) -> dict:
    """frame text -> function name."""
    unnamed = collections.defaultdict(set)
    mangled = set()
    for frames, _ in stacks:
        for frame in frames:
            lib, offset, symbol = _split(frame)
            if symbol:
                mangled.add(symbol)
            if lib != "?" and Path(lib).is_file():
                unnamed[lib].add(offset)
    demangled = dict(zip(sorted(mangled), _run(["c++filt"], sorted(mangled))))
    located = {}
    for lib, offsets in unnamed.items():
        ordered = sorted(offsets)
        lines = _run(["addr2line", "-f", "-C", "-e", lib], ordered)
        for offset, name in zip(ordered, lines[0::2]):
            if name != "??":
                located[(lib, offset)] = name
    names = {}
    for frames, _ in stacks:
        for frame in frames:
            lib, offset, symbol = _split(frame)
            if "@" not in frame:  # a marker the sampler wrote, such as "[unwound no further]"
                names[frame] = frame
                continue
            names[frame] = located.get((lib, offset)) or demangled.get(symbol) or f"{Path(lib).name}+{offset}"
    return names


def _run(command: list, items: list) -> list:
    if not items:
        return []
    done = subprocess.run(command, input="\n".join(items) + "\n", capture_output=True, text=True, check=True)
    return done.stdout.splitlines()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stacks", type=Path)
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--within", default=None)
    args = parser.parse_args()
    stacks = read_stacks(args.stacks)
    names = _names(stacks)
    inclusive, own, total = collections.Counter(), collections.Counter(), 0
    for frames, count in stacks:
        named = [names[f] for f in frames]
        if args.within:
            under = [i for i, name in enumerate(named) if args.within in name]
            if not under:
                continue
            named = named[under[0]:]
        total += count
        for name in set(named):
            inclusive[name] += count
        own[named[-1]] += count
    print(f"{args.stacks}: {total} samples" + (f" under {args.within}" if args.within else ""))
    for title, table in (("inclusive", inclusive), ("own", own)):
        print(title + ":")
        for name, count in table.most_common(args.top):
            print(f"  {100 * count / max(total, 1):5.1f}%  {name[:160]}")


if __name__ == "__main__":
    main()
