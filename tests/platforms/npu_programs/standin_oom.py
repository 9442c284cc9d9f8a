"""Out of memory against the stand-in's cap (NPU_STANDIN_MEMORY_BYTES),
through torch_npu's caching allocator: torch's OutOfMemoryError, and the
program goes on. Prints one JSON line.

    NPU_STANDIN_MEMORY_BYTES=... python tests/platforms/npu_programs/standin_oom.py
"""
import json
import os

import torch
import torch_npu  # noqa: F401

import standin_controls as standin

CHUNK_FLOATS = 8 << 20  # 32 MiB


def main() -> dict:
    cap = int(os.environ["NPU_STANDIN_MEMORY_BYTES"])
    kept, error = [], None
    try:
        for _ in range(cap // (CHUNK_FLOATS * 4) + 2):
            kept.append(torch.ones(CHUNK_FLOATS, device="npu"))
    except Exception as err:  # the case records what it raised
        error = err
    held = len(kept)
    in_use_at_error = standin.memory_in_use(0)
    kept.clear()
    torch.npu.empty_cache()
    after = torch.ones(1024, device="npu") * 3
    npu_oom = getattr(torch.npu, "OutOfMemoryError", None)
    return {
        "error_type": type(error).__name__ if error else None,
        "is_torch_oom": isinstance(error, torch.OutOfMemoryError),
        "is_torch_npu_oom": isinstance(error, npu_oom) if npu_oom else None,
        "message": str(error)[:400] if error else None,
        "chunks_held": held,
        "in_use_at_error": in_use_at_error,
        "cap": cap,
        "in_use_after_empty_cache": standin.memory_in_use(0),
        "after": after.cpu()[:2].tolist(),
    }


if __name__ == "__main__":
    print(json.dumps(main()))
