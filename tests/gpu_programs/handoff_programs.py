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


PROGRAMS = {"harness": harness}

if __name__ == "__main__":
    print(json.dumps(PROGRAMS[sys.argv[1]](*sys.argv[2:])))
