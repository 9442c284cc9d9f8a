"""Sanitizer overhead on a multi-stream workload: no sanitizer, CSAN
(torch.cuda._sanitizer), and npu_lifetime's lifetime sanitizer (also with
the allocator shim), each in its own process, rounds alternating.

The workload hands a chain of small tensors between three streams with
events (a few thousand ops per run), race-free and with every free covered,
so no variant reports anything.

    python benchmarks/bench_sanitizer.py [--rounds 3] [--steps 400] [--repeats 7]
    python benchmarks/bench_sanitizer.py --device sim   # CPU: simulated streams
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from variants import ROOT, alternate, at_least_one, run_child  # noqa: E402


def workload(dev, steps: int) -> int:
    """Returns the number of ops it ran (counted on the first call)."""
    import torch

    streams = [dev.default_stream(), dev.Stream(), dev.Stream()]
    a = dev.randn(64)
    for i in range(steps):
        prod, cons = streams[i % 3], streams[(i + 1) % 3]
        with dev.stream(prod):
            b = a @ a
            c = b.relu()
            d = c + 1
            e = d * 0.5
            e.sum()
        cons.wait_stream(prod)
        with dev.stream(cons):
            a = torch.tanh(e * 0.1)
        prod.wait_stream(cons)  # e's last use, before prod may reuse its memory
    dev.synchronize()
    return steps * 7


def _device(device: str):
    import torch

    sys.path.insert(0, str(ROOT / "tests"))
    from helpers.stream_devices import CudaDevice, SimDevice

    dev = CudaDevice if device == "cuda" else SimDevice
    dev.randn = (lambda n: torch.randn(n, n, device="cuda")) if device == "cuda" else (lambda n: torch.randn(n, n))
    return dev


def _pick_device(parser: argparse.ArgumentParser, asked: "str | None") -> str:
    """CUDA where there is a GPU; else the simulated device, said aloud."""
    import torch

    if torch.cuda.is_available():
        return asked or "cuda"
    if asked == "cuda":
        parser.error("--device cuda needs a CUDA GPU and this machine has none; "
                     "--device sim runs the workload on simulated streams")
    if asked is None:
        print("no CUDA GPU here: running on the simulated device (CPU tensors on simulated streams; "
              "CSAN and the shim need CUDA and are left out)", file=sys.stderr)
    return "sim"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child")
    parser.add_argument("--device", choices=["cuda", "sim"], help="default: cuda when a GPU is present, else sim")
    parser.add_argument("--rounds", type=at_least_one, default=3)
    parser.add_argument("--steps", type=at_least_one, default=400)
    parser.add_argument("--repeats", type=at_least_one, default=7)
    parser.add_argument("--floor", action="store_true",
                        help="also time an empty TorchDispatchMode: torch's dispatch floor under any such sanitizer")
    parser.add_argument("--torch-trace", action="store_true",
                        help="also time the lifetime sanitizer with torch's own trace delivery instead of the GPU "
                             "trace bridge (CUDA): what the bridge saves")
    args = parser.parse_args()
    if not args.child:
        args.device = _pick_device(parser, args.device)
    if args.child:
        import torch

        torch.set_num_threads(1)  # CPU ops: one thread, less noise
        dev = _device(args.device)
        run_child(args.child, args.device, lambda: workload(dev, 20), lambda: workload(dev, args.steps), args.repeats)
        return
    alternate(__file__, args.device, args.rounds, ["--steps", str(args.steps), "--repeats", str(args.repeats)],
              "3-stream hand-off chain", floor=args.floor,
              torch_trace=args.torch_trace)


if __name__ == "__main__":
    main()
