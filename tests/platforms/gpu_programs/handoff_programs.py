"""The hand-off harness on real CUDA streams with the shim (one process:
the shim is installed once, its policy switched per run)."""
import json
import sys

import torch

import npu_lifetime
from npu_lifetime import shim
from npu_lifetime.handoff import BROKEN, CORRECT, CudaHandoffDevice, RecordStreamHandoff, RecordUseHandoff, run_handoff

RUNS = [(cls, "poll") for cls in CORRECT] + [(RecordUseHandoff, "stream_wait"), (RecordStreamHandoff, "stream_wait")]
RUNS += [(cls, "poll") for cls in BROKEN]


def harness(width="256", layers="6", steps="2", sanitize="1"):
    npu_lifetime.install("cuda")
    device = CudaHandoffDevice()
    out, reference = [], None
    for cls, policy in RUNS:
        shim.set_policy(policy)
        r = run_handoff(device, cls, layers=int(layers), width=int(width), heavy=3, steps=int(steps),
                        sanitize=sanitize == "1")
        if reference is None:
            reference = r.outputs
        same = all(torch.equal(a, b) for a, b in zip(r.outputs, reference))
        out.append({"handoff": r.handoff, "policy": policy, "peak_active_bytes": r.peak_active_bytes,
                    "findings": r.finding_kinds, "same_outputs": same, "step_ms": r.step_median_ms})
    return out


def debug(width="512", layers="6", runs="3", delay="20000000"):
    """Every hand-off with the shim in debug mode, several runs each: the
    broken ones must show NaN in their outputs on every run, the correct ones
    the recipe's outputs; and the step-time cost of debug mode for record_use."""
    import math
    import statistics

    npu_lifetime.install("cuda")
    device = CudaHandoffDevice()
    out, reference = [], None
    for cls in CORRECT + BROKEN:
        nan_runs, same_runs = 0, 0
        for _ in range(int(runs)):
            shim.set_debug(True)
            r = run_handoff(device, cls, layers=int(layers), width=int(width), heavy=3, steps=1, sanitize=False,
                            consumer_delay=int(delay))  # a slow consumer: its last read runs late
            shim.set_debug(False)
            if reference is None:
                reference = r.outputs
            nan_runs += any(bool(torch.isnan(t).any()) for t in r.outputs)
            same_runs += all(torch.equal(a, b) for a, b in zip(r.outputs, reference))
        out.append({"handoff": r.handoff, "runs": int(runs), "nan_runs": nan_runs, "same_runs": same_runs})
    times = {True: [], False: []}
    for i in range(6):
        mode = i % 2 == 0
        shim.set_debug(mode)
        r = run_handoff(device, RecordUseHandoff, layers=int(layers), width=int(width), heavy=3, steps=3,
                        sanitize=False)
        times[mode] += r.step_seconds
    shim.set_debug(False)
    cost = {"step_ms_debug": statistics.median(times[True]) * 1e3,
            "step_ms_plain": statistics.median(times[False]) * 1e3}
    return {"rows": out, "cost": {k: round(v, 3) for k, v in cost.items() if not math.isnan(v)}}


PROGRAMS = {"harness": harness, "debug": debug}

if __name__ == "__main__":
    print(json.dumps(PROGRAMS[sys.argv[1]](*sys.argv[2:])))
