"""deepspeedai/DeepSpeed#7898: ZeRO-3 NaN weights with PyTorch 2.10+: the reduce stream waits on the default stream, the gradient is produced on another.

Before copying gradients into the IPG bucket, the reduce-and-partition
stream synchronised with ``default_stream()``.  Autograd runs each backward
op on its forward op's stream, which in ZeRO-3 can be a non-default stream,
so the reduce-scatter read the gradient before the kernel producing it had
written it.  The fix waits on ``current_stream()``.  Nothing is freed: a
read-after-write race, so record_use does not apply.
"""
import torch

from npu_lifetime.corpus.case import Case, main
from npu_lifetime.corpus.device import same

CASE = Case(
    name="deepspeed_zero3_wrong_stream_wait",
    threads=("deepspeedai/DeepSpeed#7898",),
    summary="reduce stream waits on the default stream; the gradient is written on the backward's stream",
    finding="data_race",
    producer="backward_stream", consumer="reduce_and_partition_stream", buffer="grad",
    forms=("buggy", "upstream"),
    notes={"record_use": "nothing is freed early: the reduce reads before the write (an ordering bug)"},
)

N = 1 << 16


def program(dev, form):
    M = dev.module
    reduce_and_partition_stream = M.Stream()
    backward_stream = M.Stream()  # the stream the forward op (after an all-gather) ran on
    weight = torch.ones(N, device=dev.type)
    bucket = torch.zeros(N, device=dev.type)
    backward_stream.wait_stream(M.current_stream())
    with M.stream(backward_stream):
        dev.slow()
        grad = weight * 3.0  # the backward op writes the gradient on its forward's stream
        if form == "upstream":
            reduce_and_partition_stream.wait_stream(M.current_stream())
        else:
            reduce_and_partition_stream.wait_stream(M.default_stream())
        with M.stream(reduce_and_partition_stream):
            bucket.copy_(grad)  # __add_grad_to_ipg_bucket
    M.current_stream().wait_stream(reduce_and_partition_stream)
    M.current_stream().wait_stream(backward_stream)
    return same(bucket, 3.0)


if __name__ == "__main__":
    main(CASE, program)
