"""ROCm/pytorch#3194 (and huggingface/diffusers#13502): a default-stream matmul reads the pre-copy state of an async transfer-stream copy, ~98% of iterations.

A pinned host tensor is copied with ``copy_(..., non_blocking=True)`` on a
non-default transfer stream into a device tensor, and a matmul on the
default stream consumes it at once: nothing orders the read after the
copy's write.  The fix makes the default stream wait for the transfer
stream.  The destination is allocated on the default stream and never
freed while in use, so there is no lifetime statement to make: record_use
does not apply.
"""
import torch

from npu_lifetime.corpus.case import Case, main
from npu_lifetime.corpus.device import same

CASE = Case(
    name="rocm_transfer_stream_copy",
    threads=("ROCm/pytorch#3194", "huggingface/diffusers#13502"),
    summary="matmul on the default stream reads a tensor an async copy on the transfer stream is still writing",
    finding="data_race",
    producer="transfer_stream", consumer="default", buffer="weight",
    forms=("buggy", "upstream"),
    notes={"record_use": "the destination is never freed while in use: an ordering bug, not a lifetime one"},
)

N, ITERS = 256, 3


def program(dev, form):
    M = dev.module
    transfer_stream = M.Stream()
    default_stream = M.current_stream()
    x = torch.ones(N, N, device=dev.type)
    weight = torch.zeros(N, N, device=dev.type)
    intact = True
    for i in range(ITERS):
        host = dev.pinned(torch.full((N, N), float(i + 1)))
        transfer_stream.wait_stream(default_stream)  # the previous matmul has read weight
        with M.stream(transfer_stream):
            dev.slow()  # a transfer that takes its time
            weight.copy_(host, non_blocking=True)
        if form == "upstream":
            default_stream.wait_stream(transfer_stream)
        y = x @ weight
        intact = intact and same(y, N * (i + 1))
    return intact


if __name__ == "__main__":
    main(CASE, program)
