"""torch's FSDP2 (``fully_shard``) with its own hand-offs, and migrated to
``record_use`` + ``del`` (npu_lifetime.fsdp2): a small transformer trained
the same way under each, compared on losses, peak memory, step time and
lifetime-sanitizer findings; the two broken migrations shown to be caught by
the sanitizer and to corrupt training under memory pressure.

    torchrun --nproc_per_node=2 examples/fsdp2_record_use.py --device cuda [--allocator shim|native]
    torchrun --nproc_per_node=2 examples/fsdp2_record_use.py --device cpu     # gloo: the patches' mechanics

Every rank prints one JSON line (last line of its output) and, with --json
DIR, writes DIR/rank<N>.json.  A phase that fails is reported in "errors"
and the others still run.
"""
import argparse
import gc
import json
import math
import os
import statistics
import sys
import time
import traceback

from npu_lifetime.fsdp2 import MODES  # torch may be imported early: only CUDA allocations must wait

POLICY = None  # the shim's policy, when the shim is the allocator


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--allocator", choices=["shim", "native"], default="shim")
    parser.add_argument("--policy", default=None, help="shim policy (default: lazy_wait if the shim has it, "
                                                       "else stream_wait)")
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--steps", type=int, default=20, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=3, help="timing rounds (recipe and record_use alternate)")
    parser.add_argument("--check-steps", type=int, default=3, help="steps of each sanitizer and pressure run")
    parser.add_argument("--sleep-cycles", type=int, default=20_000_000, help="slow consumer: torch.cuda._sleep")
    parser.add_argument("--phases", default="timing,sanitizer,pressure,hsdp",
                        help="comma-separated: timing, sanitizer, pressure, hsdp, modes (every mode once, plain)")
    parser.add_argument("--modes", default=",".join(MODES), help="modes of the 'modes' phase")
    parser.add_argument("--json", help="directory for one report per rank")
    return parser.parse_args()


ARGS = parse_args()

if ARGS.device == "cuda" and ARGS.allocator == "shim":
    import npu_lifetime  # noqa: E402
    from npu_lifetime import shim as _shim  # noqa: E402

    POLICY = ARGS.policy or ("lazy_wait" if "lazy_wait" in _shim.POLICIES else "stream_wait")
    npu_lifetime.install("cuda", policy=POLICY)  # before CUDA allocates anything

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402

from npu_lifetime import fsdp2  # noqa: E402


# -- the model: explicit math only, so that every run is bitwise reproducible -------------------------
class Block(torch.nn.Module):
    def __init__(self, width: int, heads: int = 8) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.qkv, self.proj = torch.nn.Linear(width, 3 * width), torch.nn.Linear(width, width)
        self.up, self.down = torch.nn.Linear(width, 4 * width), torch.nn.Linear(4 * width, width)

    def forward(self, x):
        b, t, w = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, w // self.heads).unbind(2)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        attn = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(w // self.heads), dim=-1)
        x = x + self.proj((attn @ v).transpose(1, 2).reshape(b, t, w))
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm2(x))))


class Net(torch.nn.Module):
    def __init__(self, width: int, layers: int) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(width) for _ in range(layers))
        self.head = torch.nn.Linear(width, width)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def build(device, mesh):
    torch.manual_seed(0)
    net = Net(ARGS.width, ARGS.layers).to(device)
    for block in net.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(net, mesh=mesh)
    return net, torch.optim.AdamW(net.parameters(), lr=1e-3)


def _zero_grad(optim):
    # its own function, so that findings freed here can be told apart
    optim.zero_grad(set_to_none=True)


# -- memory -------------------------------------------------------------------------------------------------
def settle(device) -> None:
    gc.collect()
    if device.type != "cuda":
        return
    torch.cuda.synchronize()
    from npu_lifetime.recording.torch_allocator_fallback import FALLBACK

    FALLBACK.wait_all()
    if POLICY is not None:
        from npu_lifetime import shim

        shim.process_events()
        shim.empty_cache()
    else:
        torch.cuda.empty_cache()


def reset_peak(device) -> None:
    if device.type != "cuda":
        return
    if POLICY is not None:
        from npu_lifetime import shim

        shim.reset_peak(device.index)  # the shim's statistics are per device: this rank's
    else:
        torch.cuda.reset_peak_memory_stats()


def peaks(device) -> dict:
    if device.type != "cuda":
        return {}
    if POLICY is not None:
        from npu_lifetime import shim

        s = shim.stats(device.index)
        return {"peak_active_bytes": s["active_bytes.all.peak"], "peak_reserved_bytes": s["reserved_bytes.all.peak"]}
    return {"peak_active_bytes": torch.cuda.max_memory_allocated(),
            "peak_reserved_bytes": torch.cuda.max_memory_reserved()}


# -- one training run ------------------------------------------------------------------------------------------
class Pressure(fsdp2.Instrument):
    """A slow consumer (sleep before each last read) and allocation pressure
    on the producer stream (the dropped buffer's size, filled with 0xFF = NaN)
    right after FSDP2 is done with each buffer."""

    def __init__(self, cycles: int) -> None:
        super().__init__(before_last_read=self._sleep, after_drop=self._fill)
        self.cycles, self.reuses, self.fills = cycles, 0, 0

    def _sleep(self, kind, consumer) -> None:
        torch.cuda._sleep(self.cycles)

    def _fill(self, kind, nbytes, address, device, producer) -> None:
        with torch.cuda.stream(producer):
            junk = torch.empty(nbytes, dtype=torch.uint8, device=device)
            junk.fill_(0xFF)
        self.fills += 1
        self.reuses += junk.data_ptr() == address
        del junk


def train(mode, device, mesh, steps, instrument=None, sanitize=False) -> dict:
    settle(device)
    net, optim = build(device, mesh)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(ARGS.batch, ARGS.seq, ARGS.width, generator=gen).to(device)
    target = torch.randn(ARGS.batch, ARGS.seq, ARGS.width, generator=gen).to(device)
    sanitizer = None
    if sanitize:
        from npu_lifetime.sanitizer import LifetimeSanitizer

        sanitizer = LifetimeSanitizer(device.type, on_race="collect", warn_on_free=False)
    handoffs = fsdp2.Handoffs(mode, instrument or fsdp2.Instrument())
    losses, times = [], []
    settle(device)
    reset_peak(device)
    with handoffs:
        if sanitizer is not None:
            sanitizer.enable()
        try:
            for _ in range(steps):
                t0 = time.perf_counter()
                loss = torch.nn.functional.mse_loss(net(x), target)
                loss.backward()
                optim.step()
                _zero_grad(optim)
                losses.append(loss.item())
                times.append(time.perf_counter() - t0)
            if device.type == "cuda":
                torch.cuda.synchronize()
            out = {"mode": mode, "losses": losses, "step_s": times, **peaks(device),
                   "handoffs": dict(handoffs.counts), "record_use_calls": dict(handoffs.record_use_calls),
                   "stashed": dict(handoffs.stashed), "waits_skipped": handoffs.waits_skipped}
            del net, optim, x, target, loss
            gc.collect()
            if sanitizer is not None:
                out["findings"] = classify(sanitizer, sanitizer.flush(), handoffs)
        finally:
            if sanitizer is not None:
                sanitizer.disable()
    return out


def classify(sanitizer, findings, handoffs) -> dict:
    """Findings at a free, by what they are: gradients freed by zero_grad
    (FSDP2's reduce-scatter output, latent: the next reduce-scatter makes its
    stream wait first) or anything else (unexpected); live ones counted."""
    groups, live = {}, 0
    for f in findings:
        if getattr(f, "live", False):
            live += 1
            continue
        try:
            freed_in = str(f.free_site) if getattr(f, "free_site", None) is not None else ""
            op = getattr(getattr(f, "last_use", None), "op", None)
            stream = sanitizer.describe(f.usage_stream) if hasattr(f, "usage_stream") else "?"
            label = (f"{f.kind}: gradient freed by zero_grad" if "_zero_grad" in freed_in else
                     f"{f.kind}: {op} on {stream}, freed at {freed_in}")
        except Exception as err:  # the sanitizer's findings changed shape: say so, keep going
            label = f"{getattr(f, 'kind', '?')}: unclassified ({err})"
        groups[label] = groups.get(label, 0) + 1
    unexpected = {k: v for k, v in groups.items() if "gradient freed by zero_grad" not in k}
    return {"at_free": groups, "unexpected": unexpected, "live": live,
            "first_unexpected": next((sanitizer.report([f]) for f in findings if not getattr(f, "live", False)
                                      and "_zero_grad" not in str(getattr(f, "free_site", ""))), None)}


# -- phases -------------------------------------------------------------------------------------------------------
def phase_timing(device, mesh) -> dict:
    runs = {fsdp2.RECIPE: [], fsdp2.RECORD_USE: []}
    order = [fsdp2.RECIPE, fsdp2.RECORD_USE]
    for r in range(ARGS.rounds):
        for mode in (order if r % 2 == 0 else order[::-1]):
            runs[mode].append(train(mode, device, mesh, ARGS.steps + 2))
    out = {}
    for mode, rs in runs.items():
        steps = sorted(t for run in rs for t in run["step_s"][2:])  # two warm-up steps per run
        out[mode] = {"losses": rs[0]["losses"],
                     "losses_same_every_round": all(r["losses"] == rs[0]["losses"] for r in rs),
                     "step_ms_median": steps[len(steps) // 2] * 1e3 if steps else None,
                     "round_step_ms": [statistics.median(run["step_s"][2:]) * 1e3 for run in rs if run["step_s"][2:]],
                     "peak_active_bytes": max((r.get("peak_active_bytes", 0) for r in rs), default=0),
                     "peak_reserved_bytes": max((r.get("peak_reserved_bytes", 0) for r in rs), default=0),
                     "handoffs_per_run": rs[0]["handoffs"], "record_use_calls_per_run": rs[0]["record_use_calls"]}
    return out


def phase_sanitizer(device, mesh) -> dict:
    return {mode: {k: v for k, v in train(mode, device, mesh, ARGS.check_steps, sanitize=True).items()
                   if k in ("losses", "findings", "handoffs", "record_use_calls", "stashed")}
            for mode in fsdp2.MODES}


def phase_pressure(device, mesh, reference) -> dict:
    out = {}
    for mode in fsdp2.MODES:
        pressure = Pressure(ARGS.sleep_cycles)
        run = train(mode, device, mesh, ARGS.check_steps, instrument=pressure)
        out[mode] = {"losses": run["losses"], "corrupted": not close(run["losses"], reference[:len(run["losses"])]),
                     "pressure_fills": pressure.fills, "fills_reusing_the_dropped_buffer": pressure.reuses}
    return out


def phase_hsdp(device) -> dict:
    world = dist.get_world_size()
    mesh = init_device_mesh(device.type, (world, 1), mesh_dim_names=("replicate", "shard"))
    out = {}
    for mode in (fsdp2.RECIPE, fsdp2.RECORD_USE):
        run = train(mode, device, mesh, ARGS.check_steps, sanitize=device.type == "cuda")
        out[mode] = {k: v for k, v in run.items() if k in ("losses", "findings", "handoffs", "record_use_calls",
                                                            "stashed", "peak_active_bytes")}
    out["losses_identical"] = out[fsdp2.RECIPE]["losses"] == out[fsdp2.RECORD_USE]["losses"]
    return out


def close(a, b, rtol=1e-5) -> bool:
    return len(a) == len(b) and all(math.isfinite(x) and abs(x - y) <= rtol * max(abs(y), 1e-12) for x, y in zip(a, b))


def main() -> None:
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if ARGS.device == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    report = {"rank": rank, "torch": torch.__version__, "device": ARGS.device,
              "allocator": ARGS.allocator if ARGS.device == "cuda" else "cpu", "policy": POLICY,
              "fsdp2_profile": fsdp2.check_version().torch_version, "config": vars(ARGS), "errors": {}}
    phases = ARGS.phases.split(",")
    reference = None
    for name in phases:
        try:
            if name == "timing":
                report["timing"] = phase_timing(device, mesh)
                reference = report["timing"][fsdp2.RECIPE]["losses"]
            elif name == "sanitizer" and device.type == "cuda":
                report["sanitizer"] = phase_sanitizer(device, mesh)
            elif name == "pressure" and device.type == "cuda":
                if reference is None:
                    reference = train(fsdp2.RECIPE, device, mesh, ARGS.check_steps)["losses"]
                report["pressure"] = phase_pressure(device, mesh, reference)
            elif name == "modes":  # every mode, plain (the CPU check)
                report["modes"] = {m: train(m, device, mesh, ARGS.check_steps) for m in ARGS.modes.split(",")}
            elif name == "hsdp":
                report["hsdp"] = phase_hsdp(device)
        except Exception:
            report["errors"][name] = traceback.format_exc()[-4000:]
        dist.barrier()
    line = json.dumps(report)
    if ARGS.json:
        os.makedirs(ARGS.json, exist_ok=True)
        with open(os.path.join(ARGS.json, f"rank{rank}.json"), "w") as out:
            out.write(line)
    print(line)
    sys.stdout.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
