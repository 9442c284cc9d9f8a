"""FSDP2 (``fully_shard``) under the lifetime sanitizer: a few training
steps of a small transformer on each rank (NCCL on GPUs; gloo on the
simulated device), one JSON report per rank with the findings classified as
failing (actual) or latent, and why each latent one is latent.

    torchrun --nproc_per_node=2 examples/fsdp2_sanitized.py [--device cuda|sim] [--steps 3] [--json OUT_DIR]

FSDP2 frees each reduce-scatter output (allocated on its reduce-scatter
stream, read by the optimizer on the compute stream) in ``zero_grad()``
without a hand-off: the contract calls those frees uncovered, and a check
fails on them.  They are safe because the next reduce-scatter makes its
stream wait for the compute stream before it allocates again: the
suppressions file beside this script (``fsdp2_sanitized.supp``) silences
them explicitly, latent ones only (an actual one, a reuse racing with the
use, still fails).
"""
import argparse
import gc
import json
import os

import torch
import torch.distributed as dist

from npu_lifetime.sanitizer import LifetimeSanitizer


def model(width: int, layers: int) -> torch.nn.Module:
    layer = torch.nn.TransformerEncoderLayer(width, nhead=4, dim_feedforward=2 * width, batch_first=True, dropout=0.0)
    return torch.nn.TransformerEncoder(layer, num_layers=layers, enable_nested_tensor=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "sim", choices=["cuda", "sim"])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--json", help="directory for one JSON report per rank")
    args = parser.parse_args()
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    rank, world = int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
    if args.device == "cuda":
        torch.cuda.set_device(rank)
        mesh = init_device_mesh("cuda", (world,))
        target = torch.device("cuda", rank)
    else:
        mesh = init_device_mesh("cpu", (world,))
        target = torch.device("cpu")
    torch.manual_seed(0)
    net = model(args.width, args.layers).to(target)
    for block in net.layers:
        fully_shard(block, mesh=mesh)
    fully_shard(net, mesh=mesh)
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)
    x = torch.randn(4, 16, args.width, device=target)
    suppressions = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fsdp2_sanitized.supp")
    sanitizer = LifetimeSanitizer(args.device, on_race="collect", warn_on_free=False, suppressions=suppressions)
    losses = []
    with sanitizer:
        for _ in range(args.steps):
            loss = net(x).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(float(loss.detach()))
        if args.device == "cuda":
            torch.cuda.synchronize()
        gc.collect()
    findings = [f for f in sanitizer.flush() if not getattr(f, "live", False)]
    report = {"program": "fsdp2", "device": args.device, "rank": rank, "losses": losses,
              **sanitizer.summary(findings, reports=3)}
    print(json.dumps(report))
    if args.json:
        os.makedirs(args.json, exist_ok=True)
        with open(os.path.join(args.json, f"rank{rank}.json"), "w") as out:
            json.dump(report, out, indent=2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
