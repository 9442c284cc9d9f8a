"""FSDP2 (``fully_shard``) over NCCL with the npu_lifetime shim as the CUDA
allocator and the lifetime sanitizer on: a few training steps of a small
transformer; each rank reports its findings and peak memory.

    torchrun --nproc_per_node=2 examples/fsdp2_shim_sanitizer.py [--steps 3] [--json out_dir]

The shim must be installed before CUDA allocates anything, so this is the
first thing the script does.
"""
import argparse
import gc
import json
import os
from collections import Counter

import npu_lifetime

npu_lifetime.install("cuda", policy=os.environ.get("NPU_LIFETIME_POLICY", "poll"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402

from npu_lifetime import shim  # noqa: E402
from npu_lifetime.sanitizer import LifetimeSanitizer  # noqa: E402


def model(width: int, layers: int) -> torch.nn.Module:
    layer = torch.nn.TransformerEncoderLayer(width, nhead=8, dim_feedforward=4 * width, batch_first=True)
    return torch.nn.TransformerEncoder(layer, num_layers=layers, enable_nested_tensor=False)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--json", help="directory for one JSON report per rank")
    args = parser.parse_args()
    rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    torch.manual_seed(0)
    net = model(args.width, args.layers).cuda()
    for block in net.layers:
        fully_shard(block)
    fully_shard(net)
    optim = torch.optim.AdamW(net.parameters(), lr=1e-3)
    x = torch.randn(8, 64, args.width, device="cuda")

    sanitizer = LifetimeSanitizer("cuda", on_race="collect", warn_on_free=False)
    shim.reset_peak()
    losses = []
    with sanitizer:
        for _ in range(args.steps):
            loss = net(x).pow(2).mean()
            loss.backward()
            optim.step()
            optim.zero_grad()
            losses.append(float(loss))
        torch.cuda.synchronize()
        gc.collect()
        findings = sanitizer.flush()
    stats = shim.stats()
    freed = [f for f in findings if not getattr(f, "live", False)]
    report = {
        "rank": rank,
        "losses": losses,
        "findings": dict(Counter(f.kind for f in findings)),
        "findings_at_free": len(freed),
        "first_findings": [sanitizer.report([f]) for f in findings[:3]],
        "shim_findings": [f["kind"] for f in shim.findings()],
        "peak_active_bytes": stats["active_bytes.all.peak"],
        "peak_reserved_bytes": stats["reserved_bytes.all.peak"],
        "deferred_frees": stats["deferred_frees"],
        "events_recorded": stats["events_recorded"],
    }
    print(json.dumps(report))
    if args.json:
        os.makedirs(args.json, exist_ok=True)
        with open(os.path.join(args.json, f"rank{rank}.json"), "w") as out:
            json.dump(report, out, indent=2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
