"""A data loader whose batches are prefetched to the device on a side
stream, the classic way: the copy of batch i+1 overlaps step i; the compute
stream waits for the copy before using the batch, and ``record_stream``
hands each batch (allocated on the side stream, used on the compute stream)
over to the compute stream for its free.

    python examples/prefetch_loader.py [--device cuda|sim] [--steps 20] [--json out.json]

Runs under the lifetime sanitizer and prints one JSON line: the findings
(expected: none).
"""
import argparse
import gc
import json

import torch
from torch.utils.data import DataLoader, TensorDataset

import npu_lifetime
from npu_lifetime.sanitizer import LifetimeSanitizer


class Streams:
    """torch.cuda's stream API, or the simulated device's on CPU."""

    def __init__(self, device: str) -> None:
        if device == "cuda":
            self.target, self.Stream, self.stream = "cuda", torch.cuda.Stream, torch.cuda.stream
            self.current = torch.cuda.current_stream
        else:
            from npu_lifetime import simdevice as sd

            self.target, self.Stream, self.stream, self.current = "cpu", sd.Stream, sd.stream, sd.current_stream


class Prefetcher:
    def __init__(self, loader: DataLoader, streams: Streams) -> None:
        self.loader, self.s = loader, streams
        self.side = streams.Stream()
        self.batches = iter(loader)
        self.next = None
        self._preload()

    def _preload(self) -> None:
        try:
            host = next(self.batches)
        except StopIteration:
            self.next = None
            return
        if self.s.target == "cpu":
            # On the simulated device the host batch is device memory too: the
            # side stream waits for the loader's writes, and the batch is handed
            # to the side stream for its free (on CUDA it is pinned host memory,
            # outside the device's streams, and torch's pinned-memory allocator
            # holds it until the copy is done).
            self.side.wait_stream(self.s.current())
            for t in host:
                npu_lifetime.record_stream(t, self.side)
        with self.s.stream(self.side):
            self.next = [t.to(self.s.target, non_blocking=True, copy=True) for t in host]

    def __iter__(self):
        return self

    def __next__(self):
        if self.next is None:
            raise StopIteration
        main = self.s.current()
        main.wait_stream(self.side)  # the copy is done before the compute stream reads the batch
        batch = self.next
        for t in batch:
            npu_lifetime.record_stream(t, main)  # allocated on side, used on main
        self._preload()
        return batch


def train(device: str, steps: int) -> float:
    torch.manual_seed(0)
    streams = Streams(device)
    data = TensorDataset(torch.randn(steps * 16, 64), torch.randn(steps * 16, 1))
    loader = DataLoader(data, batch_size=16, pin_memory=device == "cuda")
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1)).to(streams.target)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss = torch.zeros(())
    for x, y in Prefetcher(loader, streams):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "sim", choices=["cuda", "sim"])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--json")
    args = parser.parse_args()
    sanitizer = LifetimeSanitizer(args.device, on_race="collect", warn_on_free=False)
    with sanitizer:
        loss = train(args.device, args.steps)
        gc.collect()
    findings = [f for f in sanitizer.flush() if not getattr(f, "live", False)]
    result = {"program": "prefetch_loader", "device": args.device, "loss": loss, **sanitizer.summary(findings)}
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
