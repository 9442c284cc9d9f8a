"""Bad inputs that need a CUDA device, each program in a fresh process (the
shim can be installed only before CUDA allocates).  Each case is the error
type and message it gave, or "ok" for a good call next to it (a control);
the program prints one JSON line {case: [type, message] or "ok"}.

    python tests/platforms/gpu_programs/bad_input_programs.py native|installed
"""
import json
import sys

import torch

import npu_lifetime
from npu_lifetime import memory, shim
from npu_lifetime import simdevice as sd


def attempt(call) -> object:
    try:
        call()
    except Exception as err:  # the case records what it raised
        return [type(err).__name__, str(err)]
    return "ok"


def freed_cuda_tensor() -> torch.Tensor:
    t = torch.ones(1024, device="cuda")
    t.untyped_storage().resize_(0)
    return t


def native() -> dict:
    """Under torch's own caching allocator."""
    runtime_before = shim.runtime_name()
    x = torch.ones(1024, device="cuda")
    side = torch.cuda.Stream()
    return {
        "shim runtime before": runtime_before,
        "record_stream control": attempt(lambda: npu_lifetime.record_stream(x, side)),
        "record_stream int stream": attempt(lambda: npu_lifetime.record_stream(x, 7)),
        "record_stream None": attempt(lambda: npu_lifetime.record_stream(x, None)),
        "record_stream simdevice stream": attempt(lambda: npu_lifetime.record_stream(x, sd.Stream())),
        "record_stream freed storage": attempt(lambda: npu_lifetime.record_stream(freed_cuda_tensor(), side)),
        "record_use control": attempt(lambda: npu_lifetime.record_use(x, side)),
        "record_use int stream": attempt(lambda: npu_lifetime.record_use(x, 7)),
        "record_use simdevice stream": attempt(lambda: npu_lifetime.record_use(x, sd.Stream())),
        "record_use empty tensor": attempt(lambda: npu_lifetime.record_use(torch.empty(0, device="cuda"), side)),
        "erase_stream without the shim": attempt(lambda: npu_lifetime.erase_stream(x, side)),
        "install after cuda was used": attempt(lambda: npu_lifetime.install("cuda")),
        "shim runtime after the failed install": shim.runtime_name(),
    }


def installed() -> dict:
    """After npu_lifetime.install("cuda", policy="poll")."""
    npu_lifetime.install("cuda", policy="poll")
    x = torch.ones(1024, device="cuda")
    side = torch.cuda.Stream()
    count = torch.cuda.device_count()
    out = {
        "install npu too": attempt(lambda: npu_lifetime.install("npu")),
        "install bad policy": attempt(lambda: npu_lifetime.install("cuda", policy="eventually")),
        "install debug int": attempt(lambda: npu_lifetime.install("cuda", debug=1)),
        "policy after the failed calls": shim.policy(),
        "debug after the failed calls": shim.debug(),
        "memory_allocated control": attempt(lambda: memory.memory_allocated(torch.device("cuda", 0))),
        "memory_allocated str control": attempt(lambda: memory.memory_allocated("cuda:0")),
        "memory_allocated beyond the devices": attempt(lambda: memory.memory_allocated(f"cuda:{count}")),
        "memory_allocated index beyond the devices": attempt(lambda: memory.memory_allocated(count)),
        "memory_allocated cpu": attempt(lambda: memory.memory_allocated("cpu")),
        "torch max_memory_allocated beyond the devices": attempt(lambda: torch.cuda.max_memory_allocated(count)),
        "record_stream then erase_stream control": attempt(lambda: (npu_lifetime.record_stream(x, side),
                                                                    npu_lifetime.erase_stream(x, side))),
        "erase_stream None": attempt(lambda: npu_lifetime.erase_stream(x, None)),
        "erase_stream int stream": attempt(lambda: npu_lifetime.erase_stream(x, 7)),
        "erase_stream freed storage": attempt(lambda: npu_lifetime.erase_stream(freed_cuda_tensor(), side)),
        "shim alloc with a stream object": attempt(lambda: shim.alloc(64, 0, side)),
        "shim alloc control": attempt(lambda: shim.free(shim.alloc(64, 0, side.cuda_stream), 64, 0,
                                                        side.cuda_stream)),
    }
    torch.cuda.synchronize()
    out["findings"] = [f["kind"] for f in shim.findings()]
    return out


PROGRAMS = {f.__name__: f for f in (native, installed)}

if __name__ == "__main__":
    print(json.dumps(PROGRAMS[sys.argv[1]](*sys.argv[2:])))
