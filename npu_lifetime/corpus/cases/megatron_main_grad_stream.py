"""NVIDIA/Megatron-LM#6187 (root cause found in the review of #6137; the check of #6441): silent gradient corruption in MFSDP v2 HSDP.

``main_grad`` was allocated while ``fully_shard()`` ran on the current
(default) stream, but during backward it is read by the reduce-scatter on
the reduce-scatter stream and then replaced by a fresh buffer.  Dropping the
old one hands its block back to the default stream's pool while the
asynchronous reduce-scatter may still be reading it; the next default-stream
allocation (the next layer's gradient) overwrites it.  The upstream fix
allocates ``main_grad`` on the reduce-scatter stream (#6187); #6441 then
checks each buffer's allocation stream before it is replaced.  With
record_use the buffer stays where it was and the free waits for the read.
"""
import torch

from npu_lifetime.corpus.case import Case, main
from npu_lifetime.corpus.device import same

CASE = Case(
    name="megatron_main_grad_stream",
    threads=("NVIDIA/Megatron-LM#6187", "NVIDIA/Megatron-LM#6441", "NVIDIA/Megatron-LM#6137"),
    summary="main_grad allocated on the default stream, reduce-scattered on the RS stream, replaced unrecorded",
    finding="uncovered_free",
    producer="default", consumer="reduce_scatter_stream", buffer="main_grad",
)

N, SHARDS, LAYERS = 1 << 16, 4, 3


def program(dev, form):
    M = dev.module
    reduce_scatter_stream = M.Stream()
    compute = M.current_stream()
    intact = True
    for layer in range(LAYERS):
        if form == "upstream":
            with M.stream(reduce_scatter_stream):  # allocate main_grad on the reduce-scatter stream
                main_grad = torch.zeros(N, device=dev.type)
            compute.wait_stream(reduce_scatter_stream)
        else:
            main_grad = torch.zeros(N, device=dev.type)  # made while fully_shard() ran on the current stream
        main_grad.add_(torch.full((N,), float(layer + 1), device=dev.type))  # wgrad accumulation (backward)
        reduce_scatter_stream.wait_stream(compute)
        with M.stream(reduce_scatter_stream):
            dev.slow()  # the collective is still running when the host moves on
            shard = main_grad.view(SHARDS, -1).sum(0)  # reduce-scatter's read of its input
        if form == "record_use":
            import npu_lifetime

            npu_lifetime.record_use(main_grad, reduce_scatter_stream)
        main_grad = None  # redistributed and replaced: the old buffer is dropped
        nxt = torch.full((N,), -1.0, device=dev.type)  # the next layer's gradient, on the default stream
        compute.wait_stream(reduce_scatter_stream)
        intact = intact and same(shard, SHARDS * (layer + 1))
        del nxt
    return intact


if __name__ == "__main__":
    main(CASE, program)
