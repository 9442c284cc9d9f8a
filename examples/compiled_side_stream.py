"""A ``torch.compile``d model trained on the compute stream while a side
stream keeps an exponential moving average (EMA) of its weights: after each
optimizer step the side stream waits for the compute stream and updates the
EMA from the weights; before the next optimizer step writes the weights, the
compute stream waits for the side stream.

    python examples/compiled_side_stream.py [--device cuda|sim] [--steps 10] [--backend inductor]

Under the lifetime sanitizer: the compiled graph's kernels do not pass
through a dispatch mode (nor CSAN's), so inside the graph only allocations
(CUDA's trace) are seen; everything around it (the EMA, the optimizer, the
hand-offs) is.  Prints one JSON line (expected: no findings that fail).
"""
import argparse
import gc
import json

import torch

from npu_lifetime.sanitizer import LifetimeSanitizer


def streams(device: str):
    if device == "cuda":
        return "cuda", torch.cuda.Stream(), torch.cuda.stream, torch.cuda.current_stream
    from npu_lifetime import simdevice as sd

    return "cpu", sd.Stream(), sd.stream, sd.current_stream


def train(device: str, steps: int, backend: str) -> float:
    torch.manual_seed(0)
    target, side, stream, current = streams(device)
    model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128)).to(target)
    compiled = torch.compile(model, backend=backend)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    compute = current()
    side.wait_stream(compute)
    with stream(side):
        ema = [p.detach().clone() for p in model.parameters()]
    x = torch.randn(32, 128, device=target)
    loss = torch.zeros(())
    for _ in range(steps):
        loss = compiled(x).pow(2).mean()
        loss.backward()
        compute.wait_stream(side)  # the EMA has read the weights the optimizer is about to write
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        side.wait_stream(compute)  # the weights are written before the EMA reads them
        with stream(side), torch.no_grad():
            for e, p in zip(ema, model.parameters()):
                e.mul_(0.9).add_(p, alpha=0.1)
    compute.wait_stream(side)
    return float(loss.detach())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "sim", choices=["cuda", "sim"])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--backend", default="inductor", help="torch.compile backend (aot_eager: kernels visible)")
    parser.add_argument("--json")
    args = parser.parse_args()
    sanitizer = LifetimeSanitizer(args.device, on_race="collect", warn_on_free=False)
    with sanitizer:
        loss = train(args.device, args.steps, args.backend)
        gc.collect()
    findings = [f for f in sanitizer.flush() if not getattr(f, "live", False)]
    result = {"program": "compiled_side_stream", "device": args.device, "backend": args.backend, "loss": loss,
              **sanitizer.summary(findings)}
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
