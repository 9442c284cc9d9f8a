"""DistributedDataParallel under the lifetime sanitizer: a few training
steps of a small MLP on each rank, gradients all-reduced by DDP's reducer
(NCCL on GPUs, gloo on the simulated device), one JSON report per rank.

    torchrun --nproc_per_node=2 examples/ddp_sanitized.py [--device cuda|sim] [--steps 5] [--json OUT_DIR]

DDP's reducer calls the c10d collectives from C++ through the dispatcher, so
the sanitizer sees them as accesses on the backend's stream; on NCCL the
device trace shows the stream's waits and the reducer's ``wait()``.
"""
import argparse
import gc
import json
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from npu_lifetime.sanitizer import LifetimeSanitizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "sim", choices=["cuda", "sim"])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--json", help="directory for one JSON report per rank")
    args = parser.parse_args()
    rank = int(os.environ["LOCAL_RANK"])
    if args.device == "cuda":
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
        target = torch.device("cuda", rank)
    else:
        dist.init_process_group("gloo")
        target = torch.device("cpu")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64)).to(target)
    ddp = DDP(model, device_ids=[rank] if args.device == "cuda" else None, bucket_cap_mb=1)
    optimizer = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    x = torch.randn(32, 64, device=target) + rank
    sanitizer = LifetimeSanitizer(args.device, on_race="collect", warn_on_free=False)
    losses = []
    with sanitizer:
        for _ in range(args.steps):
            loss = ddp(x).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(float(loss.detach()))
        if args.device == "cuda":
            torch.cuda.synchronize()
        gc.collect()
    findings = [f for f in sanitizer.flush() if not getattr(f, "live", False)]
    report = {"program": "ddp", "device": args.device, "rank": rank, "losses": losses, **sanitizer.summary(findings)}
    print(json.dumps(report))
    if args.json:
        os.makedirs(args.json, exist_ok=True)
        with open(os.path.join(args.json, f"rank{rank}.json"), "w") as out:
            json.dump(report, out, indent=2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
