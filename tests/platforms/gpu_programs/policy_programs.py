"""The RFC's design-critical test on the GPU: with record_use under the
default policy, peak memory is the same whether the host runs far ahead of
the GPU or waits for it every step, and whether it polls the shim often or
never.  Prints one JSON line.

    python tests/platforms/gpu_programs/policy_programs.py timing_independence POLICY
"""
import json
import sys

import torch

import npu_lifetime
from npu_lifetime import shim

LAYERS, STEPS, N = 8, 6, 4 << 20  # 16 MiB buffers


def handoff_steps(sync_every_step: bool, poll: bool) -> int:
    """All-gather-like buffers produced on `comm`, read by a slow consumer
    on the default stream, record_use'd and freed each layer; returns the
    peak reserved bytes of the run."""
    compute = torch.cuda.current_stream()
    comm = torch.cuda.Stream()
    weight = torch.randn(N, device="cuda")
    torch.cuda.synchronize()
    shim.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    checksum = torch.zeros((), device="cuda")
    for _ in range(STEPS):
        for _ in range(LAYERS):
            with torch.cuda.stream(comm):
                comm.wait_stream(compute)
                buf = torch.empty(N, device="cuda")
                buf.copy_(weight)
            compute.wait_stream(comm)
            torch.cuda._sleep(2_000_000)  # the consumer is slow: the host runs ahead unless it syncs
            checksum += buf.sum()
            npu_lifetime.record_use(buf, compute)
            del buf
            if poll:
                shim.process_events()
        if sync_every_step:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    expected = float(weight.sum()) * LAYERS * STEPS
    assert abs(float(checksum) - expected) <= 1e-3 * abs(expected) + 1, (float(checksum), expected)
    return torch.cuda.max_memory_reserved()


def timing_independence(policy):
    npu_lifetime.install("cuda", policy=policy)
    torch.cuda._sleep(1)
    handoff_steps(True, False)  # warm-up
    peaks = {f"{'sync' if sync else 'ahead'}/{'poll' if poll else 'no-poll'}": handoff_steps(sync, poll)
             for sync in (False, True) for poll in (False, True)}
    return {"policy": policy, "peak_reserved": peaks, "stream_waits": shim.stats()["stream_waits"],
            "findings": shim.findings()}


PROGRAMS = {"timing_independence": timing_independence}

if __name__ == "__main__":
    print(json.dumps(PROGRAMS[sys.argv[1]](*sys.argv[2:])))
