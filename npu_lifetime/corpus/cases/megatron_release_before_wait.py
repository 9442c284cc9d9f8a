"""NVIDIA/Megatron-LM#6948 and #7062 (combined 1F1B schedule-aware tensor release): "The wait must precede resize_(0)".

In the EP 1F1B overlap a tensor made on the compute stream is read by the
dispatch all-to-all on the communication stream, and released when the next
real node no longer needs it.  ``resize_(0)`` is a host-side allocator
operation: done before the compute stream waits for the communication
stream, it makes the block allocator-visible while the all-to-all may still
read it, and the other model chunk's node (interleaved by the schedule)
allocates and writes it.  The fix enqueues the owner-stream wait first, then
resizes; record_use states the communication stream's use instead, so the
release needs no wait at all.
"""
import torch

from npu_lifetime.corpus.case import Case, main
from npu_lifetime.corpus.device import same

CASE = Case(
    name="megatron_release_before_wait",
    threads=("NVIDIA/Megatron-LM#6948", "NVIDIA/Megatron-LM#7062"),
    summary="resize_(0) of a tensor the comm stream still reads, before the compute stream waits for it",
    finding="uncovered_free",
    producer="default", consumer="comm_stream", buffer="hidden",
)

N, MICROBATCHES = 1 << 16, 3


def program(dev, form):
    M = dev.module
    comm_stream = M.Stream()
    compute = M.current_stream()
    intact = True
    for mb in range(MICROBATCHES):
        value = float(mb + 1)
        hidden = torch.full((N,), value, device=dev.type)  # this chunk's node output
        comm_stream.wait_stream(compute)
        with M.stream(comm_stream):
            dev.slow()
            dispatched = hidden * 1  # the dispatch all-to-all reads it
        if form == "upstream":
            compute.wait_stream(comm_stream)  # the wait precedes resize_(0)
        elif form == "record_use":
            import npu_lifetime

            npu_lifetime.record_use(hidden, comm_stream)
        hidden.untyped_storage().resize_(0)  # schedule-aware release
        other_chunk = torch.full((N,), -1.0, device=dev.type)  # the interleaved chunk's node
        if form == "buggy":
            compute.wait_stream(comm_stream)  # too late: the block was handed out before it
        compute.wait_stream(comm_stream)
        intact = intact and same(dispatched, value)
        del other_chunk
    return intact


if __name__ == "__main__":
    main(CASE, program)
