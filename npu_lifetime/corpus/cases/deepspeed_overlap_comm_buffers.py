"""deepspeedai/DeepSpeed#7965: ZeRO-2 overlap_comm loss becomes NaN ("Fix overlap-comm buffer lifetimes").

In ``allreduce_and_copy()`` the bucket's gradient buffers (made on the
compute stream) are reduced and copied back on the reduction stream, with
no record of that stream on their storage.  When the optimizer releases the
bucket, the allocator recycles the storage for compute-stream tensors while
the queued all-reduce and copy-back are still running.  The fix calls
``record_stream(reduction_stream)`` on the buffers.
"""
import torch

from npu_lifetime.corpus.case import Case, main
from npu_lifetime.corpus.device import same

CASE = Case(
    name="deepspeed_overlap_comm_buffers",
    threads=("deepspeedai/DeepSpeed#7965",),
    summary="grad buffers reduced and copied back on the reduction stream; bucket released unrecorded",
    finding="uncovered_free",
    producer="default", consumer="reduction_stream", buffer="",  # list elements have no name
)

N, BUCKET, STEPS = 1 << 14, 4, 2


def program(dev, form):
    M = dev.module
    reduction_stream = M.Stream()
    compute = M.current_stream()
    intact = True
    for step in range(STEPS):
        grads = [torch.full((N,), float(step + 1), device=dev.type) for _ in range(BUCKET)]  # backward
        reduction_stream.wait_stream(compute)
        with M.stream(reduction_stream):
            dev.slow()
            flat = torch.empty(BUCKET * N, device=dev.type)  # allreduce_bucket: flatten the bucket
            for i, g in enumerate(grads):
                flat[i * N:(i + 1) * N].copy_(g)
            flat.mul_(2.0)  # the all-reduce (sum over 2 ranks of equal grads)
            for buf, synced in zip(grads, flat.split(N)):
                buf.copy_(synced)  # copy the reduced values back into the bucket
            if form == "upstream":
                for buf in grads:
                    dev.record_stream(buf, reduction_stream)
        if form == "record_use":
            import npu_lifetime

            for buf in grads:
                npu_lifetime.record_use(buf, reduction_stream)
        reduced = flat
        del grads  # the bucket is released
        activations = torch.full((BUCKET * N,), -1.0, device=dev.type)  # the next compute-stream tensors
        compute.wait_stream(reduction_stream)
        intact = intact and same(reduced, 2.0 * (step + 1))
        del activations, flat, reduced
    return intact


if __name__ == "__main__":
    main(CASE, program)
