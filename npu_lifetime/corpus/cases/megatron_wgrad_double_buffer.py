"""NVIDIA/Megatron-LM#5222 (the race #4054 introduced): double-buffered wgrad "slightly corrupting our reduced gradient in a very difficult-to-see way".

Megatron-FSDP keeps gradient buffers for the reduce-scatter.  #4054 always
waited until only one unsharded gradient buffer was in use, so adjacent
layers were handed the same buffer: the next layer's fused wgrad
accumulation (compute stream) partially overwrote the previous layer's
buffer while its reduce-scatter (reduce-scatter stream) was still reading
it.  No memory is freed: the program reuses its own buffer, so this is a
write-after-read race, and record_use (a lifetime statement) does not
apply.  The fix waits for the previous reduce-scatter before the buffer is
written again (ported to ROCm/Megatron-LM as #146).
"""
import torch

from npu_lifetime.corpus.case import Case, main
from npu_lifetime.corpus.device import same

CASE = Case(
    name="megatron_wgrad_double_buffer",
    threads=("NVIDIA/Megatron-LM#5222", "NVIDIA/Megatron-LM#4054", "ROCm/Megatron-LM#146"),
    summary="adjacent layers share one wgrad buffer; the next wgrad overwrites it under the reduce-scatter",
    finding="data_race",
    producer="default", consumer="reduce_scatter_stream", buffer="grad_buffer",
    forms=("buggy", "upstream"),
    notes={"record_use": "no memory is freed: the program reuses its own buffer (a race, not a lifetime bug)"},
)

N, SHARDS, LAYERS = 1 << 16, 4, 3


def program(dev, form):
    M = dev.module
    reduce_scatter_stream = M.Stream()
    compute = M.current_stream()
    grad_buffer = torch.zeros(N, device=dev.type)  # the one buffer adjacent layers are given
    rs_done = None
    shards = []
    for layer in range(LAYERS):
        if form == "upstream" and rs_done is not None:
            compute.wait_event(rs_done)  # wait on the previous reduce-scatter before reusing the buffer
        grad_buffer.fill_(float(layer + 1))  # fused wgrad accumulation writes the buffer
        reduce_scatter_stream.wait_stream(compute)
        with M.stream(reduce_scatter_stream):
            dev.slow()
            shards.append(grad_buffer.view(SHARDS, -1).sum(0))  # reduce-scatter reads it
            rs_done = M.Event()
            rs_done.record()
    compute.wait_stream(reduce_scatter_stream)
    return all(same(s, SHARDS * (i + 1)) for i, s in enumerate(shards))


if __name__ == "__main__":
    main(CASE, program)
