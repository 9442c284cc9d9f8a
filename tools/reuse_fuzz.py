#!/usr/bin/env python3
"""The data-tag reuse fuzz: seeded random multi-stream programs against the
shim on the simulated runtime, looking for memory handed to a new owner
while an old owner's work on it can still land.

Each owner (an allocation) writes its own tag over its whole block, as a
kernel queued on every stream it uses: at allocation on its stream, again
later, and on other streams it hands the block to.  Every hand-off is made
safe the way real programs do it, drawn at random: ``record_use``,
``record_stream``, or the hand-rolled join (the owner's stream waits on the
user's before the free).  The simulated streams run queued work in stream
order and only when told to; at each check the streams run newest-first
(the order that lets an unordered reuse's write land before the old
owner's), then all to their end, and every live block must hold its owner's
tag.  A wrong tag is an early reuse.  The allocator's own invariant checker
(npl_check_invariants) runs after every step, or every K-th
(--check-every): the checker is an entry point, which ends a run of the
cached pair's uncounted repeats (a step frees a block and allocates its
size again on its stream, the hot path's pattern).

Policy (poll, lazy_wait, stream_wait), expandable segments, a device
memory limit (so the out-of-memory path runs, and with it cross-stream
reuse's waits there) and the cross-stream reuse mode (off, idle, always)
are drawn per seed; --cross-stream fixes the mode.

    python tools/reuse_fuzz.py --seeds 4000 --cross-stream always
    python tools/reuse_fuzz.py --seeds 4000 --check-every 7   # repeats of the cached pair run on between checks
    NPU_LIFETIME_SHIM=path/to/mutant.so python tools/reuse_fuzz.py --seeds 50

Exit status 1 names each failing seed and its first failure."""
from __future__ import annotations

import argparse
import ctypes
import json
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from helpers.shim_testing import invariant_violations  # noqa: E402  (the test-only checker's binding)
from npu_lifetime import shim  # noqa: E402

KIB, MIB = 1 << 10, 1 << 20
SIZES = (512, 4 * KIB, 100 * KIB, 1 * MIB, 3 * MIB, 4 * MIB)
POLICIES = ("poll", "lazy_wait", "stream_wait")
MODES = ("off", "idle", "always")  # cross-stream reuse
LIMITS = (16 * MIB, 32 * MIB)  # the simulated device's memory, when one is drawn
SAFE_HANDOFFS = ("record_use", "record_stream", "join")


@dataclass
class Owner:
    """One allocation: its block, its tag, the stream it was made on, and
    the streams it handed the block to by a hand-rolled join (waited on
    before the free)."""
    ptr: int
    size: int
    stream: int
    tag: int
    joins: set = field(default_factory=set)


class Failure(Exception):
    pass


class Program:
    """One seed's random program and its checks."""

    def __init__(self, seed: int, cross_stream: str | None, steps: int, check_every: int = 1):
        self.rng = random.Random(seed)
        self.steps, self.check_every = steps, check_every
        self.cross_stream = self.rng.choice(MODES) if cross_stream is None else cross_stream
        self.policy = self.rng.choice(POLICIES)
        self.expandable = self.rng.random() < 0.2
        self.limit = self.rng.choice(LIMITS) if self.rng.random() < 0.3 else 0
        self.ooms = 0
        self.streams = [0x1000 * (i + 1) for i in range(self.rng.randint(2, 4))]
        self.next_stream = 0x100000  # fresh streams, vllm#52950's new stream per step
        self.owners: dict[int, Owner] = {}
        self.tags = 0
        self.last_active: dict[int, int] = {}
        self.clock = 0
        self.reuses = 0  # allocations that got an address a freed owner had held
        self.cross_stream_segments = 0  # segments taken from another stream's pool
        self.unmerged_reuses = 0  # allocations that took back the block the free before left unmerged

    def run(self) -> None:
        shim.reset()
        shim.select_runtime("sim")
        shim.set_policy(self.policy)
        shim.set_expandable_segments(self.expandable)
        shim.set_cross_stream_reuse(self.cross_stream)
        shim.sim.set_memory_limit(self.limit)
        self.illegal_before = shim.sim.illegal_accesses()  # the simulated device's count runs on across resets
        self.freed_addresses: set = set()
        for step in range(self.steps):
            self.step()
            if (step + 1) % self.check_every == 0:  # an entry point: it ends a run of repeated cached pairs
                self.check_invariants(step)
            if self.rng.random() < 0.12:
                self.check_tags(f"step {step}")
        for owner in list(self.owners.values()):
            self.free(owner)
        self.check_tags("end")
        stats = shim.stats()
        self.cross_stream_segments, self.unmerged_reuses = stats["cross_stream_segments"], stats["unmerged_reuses"]
        shim.sim.complete_all()
        shim.process_events()
        self.check_invariants(self.steps)

    # -- the program ---------------------------------------------------------
    def step(self) -> None:
        roll = self.rng.random()
        if roll < 0.35 or not self.owners:
            self.allocate()
        elif roll < 0.55:
            self.hand_off(self.pick())
        elif roll < 0.62:
            owner = self.pick()
            self.write(owner, owner.stream)
        elif roll < 0.77:
            self.free(self.pick())
        elif roll < 0.85:  # the hot path's pattern: a free and the same size again on its stream (the cached pair)
            owner = self.pick()
            self.free(owner)
            self.allocate(owner.size, owner.stream)
        elif roll < 0.95:
            shim.sim.complete(self.rng.choice(self.streams))
        elif roll < 0.98:
            shim.process_events()
        else:
            shim.empty_cache()

    def pick(self) -> Owner:
        return self.owners[self.rng.choice(sorted(self.owners))]

    def allocate(self, size: int | None = None, stream: int | None = None) -> None:
        if stream is None and self.rng.random() < 0.1:
            self.streams.append(self.next_stream)
            self.next_stream += 0x1000
        stream = self.rng.choice(self.streams) if stream is None else stream
        size = self.rng.choice(SIZES) if size is None else size
        ptr = shim.alloc(size, 0, stream)
        if ptr == 0:
            if not self.limit:
                raise Failure(f"alloc({size}) on {stream:#x} failed: {shim.last_oom_message()}")
            self.ooms += 1  # the device is full: a lawful answer under a limit
            return
        if ptr in self.freed_addresses:
            self.reuses += 1
        self.tags = self.tags % 255 + 1
        owner = Owner(ptr, size, stream, self.tags)
        self.owners[ptr] = owner
        self.write(owner, stream)

    def write(self, owner: Owner, stream: int) -> None:
        if not shim.sim.fill(stream, owner.ptr, owner.tag, owner.size):
            raise Failure(f"a fill of {owner.ptr:#x} on {stream:#x} touched unmapped memory")
        self.clock += 1
        self.last_active[stream] = self.clock

    def hand_off(self, owner: Owner) -> None:
        """Another stream uses the block after its owner's work (the program
        orders it), made safe for the free the way the draw says."""
        user = self.rng.choice([s for s in self.streams if s != owner.stream] or [owner.stream])
        if user == owner.stream:
            return
        shim.sim.wait_event(user, shim.sim.record_event(owner.stream))
        self.write(owner, user)
        how = self.rng.choice(SAFE_HANDOFFS)
        if how == "record_use":
            shim.record_use(owner.ptr, user)
        elif how == "record_stream":
            shim.record_stream(owner.ptr, user)
        else:
            owner.joins.add(user)

    def free(self, owner: Owner) -> None:
        for user in owner.joins:  # the hand-rolled recipe: the owner's stream waits on its users
            shim.sim.wait_event(owner.stream, shim.sim.record_event(user))
        del self.owners[owner.ptr]
        self.freed_addresses.add(owner.ptr)
        shim.free(owner.ptr, owner.size, 0, owner.stream)

    # -- the checks ----------------------------------------------------------
    def check_invariants(self, step: int) -> None:
        broken = invariant_violations()
        if broken:
            raise Failure(f"after step {step}: allocator invariants broken: {broken[:3]}")
        illegal = shim.sim.illegal_accesses() - self.illegal_before
        if illegal:
            raise Failure(f"after step {step}: {illegal} fills touched unmapped memory")

    def check_tags(self, when: str) -> None:
        newest_first = sorted(self.streams, key=lambda s: -self.last_active.get(s, 0))
        for stream in newest_first:
            shim.sim.complete(stream)
        shim.sim.complete_all()
        for owner in self.owners.values():
            held = ctypes.string_at(owner.ptr, owner.size)
            if held != bytes([owner.tag]) * owner.size:
                at = next(i for i, byte in enumerate(held) if byte != owner.tag)
                raise Failure(f"at {when}: block {owner.ptr:#x} ({owner.size} B, stream {owner.stream:#x}) holds "
                              f"{held[at]:#04x} at offset {at}, not its tag {owner.tag:#04x}: an old owner's "
                              f"write landed after the reuse")


def fuzz(seeds: range, cross_stream: bool | None, steps: int, progress, check_every: int = 1) -> dict:
    failures, reuses, ooms, taken, pairs = [], 0, 0, 0, 0
    modes = dict.fromkeys(MODES, 0)
    started = time.monotonic()
    for n, seed in enumerate(seeds, 1):
        program = Program(seed, cross_stream, steps, check_every)
        try:
            program.run()
        except Failure as failure:
            failures.append({"seed": seed, "policy": program.policy, "cross_stream": program.cross_stream,
                             "failure": str(failure)})
        reuses += program.reuses
        ooms += program.ooms
        taken += program.cross_stream_segments
        pairs += program.unmerged_reuses
        modes[program.cross_stream] += 1
        progress(n, len(seeds), len(failures), time.monotonic() - started)
    shim.reset()
    shim.sim.set_memory_limit(0)
    return {"seeds": len(seeds), "first_seed": seeds.start, "steps": steps, "check_every": check_every,
            "failures": failures,
            "seeds_by_cross_stream_mode": modes, "reuses": reuses, "out_of_memory_answers": ooms,
            "cross_stream_segments": taken, "unmerged_reuses": pairs,
            "seconds": round(time.monotonic() - started, 1)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=500, help="how many seeds (default 500)")
    parser.add_argument("--start", type=int, default=0, help="the first seed")
    parser.add_argument("--steps", type=int, default=80, help="operations per program (default 80)")
    parser.add_argument("--cross-stream", choices=(*MODES, "draw"), default="draw",
                        help="the cross-stream reuse mode, or drawn per seed (default)")
    parser.add_argument("--check-every", type=int, default=1, metavar="K",
                        help="run the invariant checker after every K-th step (default 1); the checker is an entry "
                             "point, which settles the cached pair's repeats: K > 1 lets them run on")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    if min(args.seeds, args.steps, args.check_every) < 1:
        parser.error("--seeds, --steps and --check-every must be at least 1")
    cross_stream = None if args.cross_stream == "draw" else args.cross_stream

    def progress(n, total, failed, seconds):
        tty = sys.stderr.isatty()
        if tty or n == total or n % max(1, total // 10) == 0:
            print(f"{chr(13) if tty else ''}reuse fuzz: {n}/{total} seeds, {failed} failed, {seconds:.0f} s",
                  end="" if tty else "\n", file=sys.stderr, flush=True)

    result = fuzz(range(args.start, args.start + args.seeds), cross_stream, args.steps, progress, args.check_every)
    if sys.stderr.isatty():
        print(file=sys.stderr)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(f"{result['seeds']} seeds x {args.steps} steps (seeds {args.start}..{args.start + args.seeds - 1}), "
              f"cross-stream reuse modes {result['seeds_by_cross_stream_mode']}, {result['reuses']} address reuses, "
              f"{result['unmerged_reuses']} cached pairs taken back, "
              f"{result['out_of_memory_answers']} out-of-memory answers, {result['cross_stream_segments']} segments taken "
              f"across streams: {len(result['failures'])} failures in "
              f"{result['seconds']} s")
        for f in result["failures"][:10]:
            print(f"  seed {f['seed']} ({f['policy']}, cross-stream {f['cross_stream']}): {f['failure']}")
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
