"""meta-pytorch/torchrec#4231 (reproducing the NaN issue in EMS; background in #4034): a device-to-host copy on a copy stream reads a tensor the main stream already released.

A tensor made on the main stream is copied to a host buffer on a copy stream
(which waits for the main stream first), and the main stream releases it
with ``untyped_storage().resize_(0)`` without ``record_stream``: the block
goes back to the main stream's pool, the next allocation there takes it and
writes -1.0, and the host buffer receives the new owner's data.  The fix
records the tensor on the copy stream.
"""
import torch

from npu_lifetime.corpus.case import Case, main
from npu_lifetime.corpus.device import same

CASE = Case(
    name="torchrec_copy_stream_resize",
    threads=("meta-pytorch/torchrec#4231", "meta-pytorch/torchrec#4034"),
    summary="copy stream copies a tensor to the host; main stream resize_(0)s it with nothing recorded",
    finding="uncovered_free",
    producer="default", consumer="copy_stream", buffer="gpu_tensor",
)

N = 1 << 16


def program(dev, form):
    M = dev.module
    copy_stream = M.Stream()
    main_stream = M.current_stream()
    gpu_tensor = torch.full((N,), 2.0, device=dev.type)  # 1. alloc on the main stream
    cpu_buffer = dev.pinned(torch.zeros(N))
    copy_stream.wait_stream(main_stream)
    with M.stream(copy_stream):
        dev.slow()
        cpu_buffer.copy_(gpu_tensor, non_blocking=True)  # the copy stream reads it
    if form == "upstream":
        dev.record_stream(gpu_tensor, copy_stream)  # 2. record_stream
    elif form == "record_use":
        import npu_lifetime

        npu_lifetime.record_use(gpu_tensor, copy_stream)
    gpu_tensor.untyped_storage().resize_(0)  # 3. release
    new_tensor = torch.full((N,), -1.0, device=dev.type)  # 4. alloc new tensors: reuses the block?
    copy_stream.synchronize()  # 5. wait & validate
    del new_tensor
    return same(cpu_buffer, 2.0)


if __name__ == "__main__":
    main(CASE, program)
