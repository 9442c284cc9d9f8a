"""Activation offloading: during the forward pass, each large saved
activation is copied to host memory (pinned, ``non_blocking``) on an
offload stream and its device copy freed; during backward it is copied back
on the offload stream, which the compute stream waits for.

Each hand-off is explicit: the offload stream waits for the compute stream
before reading an activation, ``record_stream`` keeps the device activation
until the copy out is done, and the copy back (allocated on the offload
stream, used on the compute stream) is handed to the compute stream.

    python examples/offload_activations.py [--device cuda|sim] [--steps 5] [--json out.json]

Runs under the lifetime sanitizer and prints one JSON line (expected: no
findings that fail the check).
"""
import argparse
import gc
import json

import torch

import npu_lifetime
from npu_lifetime.sanitizer import LifetimeSanitizer


class Offloader(torch.autograd.graph.saved_tensors_hooks):
    def __init__(self, device: str, min_numel: int = 1024) -> None:
        if device == "cuda":
            self.target, self.offload, self.stream = "cuda", torch.cuda.Stream(), torch.cuda.stream
            self.current = torch.cuda.current_stream
        else:
            from npu_lifetime import simdevice as sd

            self.target, self.offload, self.stream, self.current = "cpu", sd.Stream(), sd.stream, sd.current_stream
        self.min_numel = min_numel
        self.offloaded = 0
        super().__init__(self.pack, self.unpack)

    def pack(self, t: torch.Tensor):
        if t.numel() < self.min_numel or isinstance(t, torch.nn.Parameter):
            return t
        compute = self.current()
        self.offload.wait_stream(compute)  # the activation is written
        with self.stream(self.offload):
            host = torch.empty(t.shape, dtype=t.dtype, pin_memory=self.target == "cuda",
                               device="cpu")
            host.copy_(t, non_blocking=True)
        npu_lifetime.record_stream(t, self.offload)  # the free of t waits for the copy out
        self.offloaded += 1
        return (host, t.requires_grad)

    def unpack(self, packed):
        if isinstance(packed, torch.Tensor):
            return packed
        host, _ = packed
        compute = self.current()
        with self.stream(self.offload):
            back = host.to(self.target, non_blocking=True, copy=True)
        compute.wait_stream(self.offload)  # the copy back is done before backward reads it
        npu_lifetime.record_stream(back, compute)  # allocated on offload, used on compute
        return back


def train(device: str, steps: int) -> tuple:
    torch.manual_seed(0)
    target = "cuda" if device == "cuda" else "cpu"
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU()) for _ in range(4)])
    model = model.to(target)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    offloader = Offloader(device)
    x = torch.randn(64, 256, device=target)
    loss = torch.zeros(())
    for _ in range(steps):
        with offloader:
            loss = model(x).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return float(loss.detach()), offloader.offloaded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "sim", choices=["cuda", "sim"])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--json")
    args = parser.parse_args()
    sanitizer = LifetimeSanitizer(args.device, on_race="collect", warn_on_free=False)
    with sanitizer:
        loss, offloaded = train(args.device, args.steps)
        gc.collect()
    findings = [f for f in sanitizer.flush() if not getattr(f, "live", False)]
    result = {"program": "offload_activations", "device": args.device, "loss": loss, "offloaded": offloaded,
              **sanitizer.summary(findings)}
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
