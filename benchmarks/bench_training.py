"""Sanitizer overhead on a training loop: forward, backward and Adam on an
MLP, with the next batch prefetched on a side stream (copied there, the
compute stream waits for it, ``record_stream`` hands it over).  Variants:
none, CSAN (torch.cuda._sanitizer), the lifetime sanitizer, the lifetime
sanitizer with the allocator shim; each in its own process, rounds
alternating.  The loop is race-free and every free is covered: no variant
may report anything that fails a check.

    python benchmarks/bench_training.py [--rounds 3] [--steps 30] [--repeats 5]
    python benchmarks/bench_training.py --device sim   # CPU: simulated streams
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from variants import alternate, run_child  # noqa: E402


class Loop:
    def __init__(self, device: str, width: int, batch: int) -> None:
        import torch

        self.torch = torch
        if device == "cuda":
            self.target = "cuda"
            self.side, self.main = torch.cuda.Stream(), torch.cuda.current_stream()
            self.stream = torch.cuda.stream
            host = [torch.randn(batch, width).pin_memory() for _ in range(4)]
        else:
            from npu_lifetime import simdevice as sd

            self.target = "cpu"
            self.side, self.main = sd.Stream(), sd.default_stream()
            self.stream = sd.stream
            host = [torch.randn(batch, width) for _ in range(4)]
        torch.manual_seed(0)
        nn = torch.nn
        self.model = nn.Sequential(
            nn.Linear(width, 4 * width), nn.ReLU(), nn.Linear(4 * width, 4 * width), nn.ReLU(),
            nn.Linear(4 * width, width),
        ).to(self.target)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-4)
        self.host = host
        self.side.wait_stream(self.main)  # the host batches (device memory on sim) exist before the loop
        self.x = self._fetch(0)
        self.main.wait_stream(self.side)
        self.x.record_stream(self.main) if device == "cuda" else self._record(self.x)

    def _record(self, t) -> None:
        import npu_lifetime

        npu_lifetime.record_stream(t, self.main)

    def _fetch(self, i: int):
        with self.stream(self.side):
            return self.host[i % len(self.host)].to(self.target, non_blocking=True, copy=True)

    def step(self, i: int) -> None:
        nxt = self._fetch(i + 1)  # prefetch on the side stream, overlapping the step
        loss = self.model(self.x).pow(2).mean()
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.main.wait_stream(self.side)  # the compute stream waits for the prefetch
        if self.target == "cuda":
            nxt.record_stream(self.main)  # allocated on side, used on main: the free waits for main
        else:
            self._record(nxt)
        self.x = nxt

    def run(self, steps: int) -> None:
        for i in range(steps):
            self.step(i)
        float(self.model[0].weight[0, 0])  # a host read-back: synchronises like a real loop's logging


def count_ops(fn) -> int:
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return Count.n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child")
    parser.add_argument("--device", default="cuda", choices=["cuda", "sim"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    if args.child:
        import torch

        torch.set_num_threads(1)
        state: dict = {}

        def warm_up():
            state["loop"] = Loop(args.device, args.width, args.batch)
            state["loop"].run(3)
            state["ops"] = count_ops(lambda: state["loop"].step(0)) * args.steps

        def timed():
            state["loop"].run(args.steps)
            if args.device == "cuda":
                torch.cuda.synchronize()
            return state["ops"]

        run_child(args.child, args.device, warm_up, timed, args.repeats)
        return
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("bench_training: no CUDA device here; run with --device sim on CPU")
    alternate(__file__, args.device, args.rounds,
              ["--steps", str(args.steps), "--repeats", str(args.repeats), "--width", str(args.width),
               "--batch", str(args.batch)],
              f"training loop (MLP {args.width}, batch {args.batch}, Adam, prefetch side stream), "
              f"{args.steps} steps")


if __name__ == "__main__":
    main()
