"""Collectives under the lifetime sanitizer on NCCL (2 GPUs, one process
per rank):

    torchrun --nproc_per_node=2 tests/platforms/gpu_programs/collective_programs.py OUT_DIR

Each rank writes ``OUT_DIR/rank{r}.json``: for each case, the kinds of the
findings that fail the check and the ops of the races.  NCCL runs an async
collective on its own stream after making it wait for the current one;
``work.wait()`` makes the current stream wait for the collective's end
event; the device trace reports both, so the sanitizer sees the collective's
writes on NCCL's stream, ordered by ``wait()``.
"""
import gc
import json
import os
import sys

import torch
import torch.distributed as dist

from npu_lifetime.lifetime import DataRace
from npu_lifetime.sanitizer import LifetimeSanitizer

SLEEP = 200_000_000  # keeps the collective's inputs from being ready early: timing must not matter


def run(case):
    san = LifetimeSanitizer("cuda", on_race="collect", warn_on_free=False)
    with san:
        case()
        torch.cuda.synchronize()
        gc.collect()
    found = [f for f in san.flush() if not getattr(f, "live", False)]
    return {
        "failing": sorted(f.kind for f in san.failing(found)),
        "races": sorted(f"{f.access.op} after {f.prior.op}" for f in found if isinstance(f, DataRace)),
        "report": san.report(found) if found else "",
    }


def all_reduce_used_before_wait():
    x = torch.ones(1 << 16, device="cuda")
    torch.cuda._sleep(SLEEP)
    work = dist.all_reduce(x, async_op=True)
    x.add_(1)  # the collective may still be writing x on NCCL's stream
    work.wait()


def all_reduce_used_after_wait():
    x = torch.ones(1 << 16, device="cuda")
    work = dist.all_reduce(x, async_op=True)
    work.wait()
    x.add_(1)


def all_reduce_synchronous():
    x = torch.ones(1 << 16, device="cuda")
    dist.all_reduce(x)
    x.add_(1)


def all_to_all_output_used_before_wait():
    x, y = torch.ones(1 << 16, device="cuda"), torch.zeros(1 << 16, device="cuda")
    work = dist.all_to_all_single(y, x, async_op=True)
    y.add_(1)
    work.wait()


def all_gather_into_tensor_after_wait():
    x = torch.full((1 << 12,), float(dist.get_rank()), device="cuda")
    out = torch.empty(2 << 12, device="cuda")
    work = dist.all_gather_into_tensor(out, x, async_op=True)
    work.wait()
    out.mul_(2)
    del x


CASES = [all_reduce_used_before_wait, all_reduce_used_after_wait, all_reduce_synchronous,
         all_to_all_output_used_before_wait, all_gather_into_tensor_after_wait]


def main() -> None:
    out_dir = sys.argv[1]
    rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    dist.barrier()
    results = {case.__name__: run(case) for case in CASES}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as out:
        json.dump(results, out, indent=2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
