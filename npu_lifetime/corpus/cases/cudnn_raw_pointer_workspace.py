"""NVIDIA/cudnn-frontend#1168 (review, P1 "Keep the per-call SWA workspace alive on the handle's launch stream"): a workspace known to the library only by its raw pointer.

The sliding-window-attention wrapper allocates its workspace on PyTorch's
ambient stream and passes only the raw pointer to cuDNN, whose handle
launches on a side stream; the local ``workspace`` reference is released
as soon as the asynchronous ``execute()`` returns, so the allocator can
hand the block to the next ambient-stream allocation while cuDNN still
uses it.  The fix allocates the workspace on the launch stream (caller-
owned workspace), or records it there.

KNOWN GAP: the sanitizer sees torch's ops only.  A library that reads and
writes device memory through raw pointers (cuDNN, NCCL called directly, a
ctypes or custom kernel) makes no access the sanitizer can see, so the
buggy form passes the check.  compute-sanitizer does not see it either:
its stream-ordered race tracking checks a memset or a copy when it is
called (the workspace is still allocated then), not when it runs; only the
data shows it (under the debug shim, the buggy form reads the poison).
A wrapper that states the access (``npu_lifetime.sanitizer.declare_access``,
the "declared" form: the bug kept, the access declared) makes it visible;
design/sanitizer.md ("What it does not see") says what more it would take.
"""
import torch

from npu_lifetime.corpus.case import Case, main
from npu_lifetime.sanitizer import declare_access
from npu_lifetime.corpus.device import same

CASE = Case(
    name="cudnn_raw_pointer_workspace",
    threads=("NVIDIA/cudnn-frontend#1168",),
    summary="workspace made on the ambient stream, used by cuDNN on its handle stream by raw pointer, released",
    finding="uncovered_free",
    producer="default", consumer="handle_stream", buffer="workspace",
    devices=("sim", "cuda"),
    gap="the library touches the workspace by raw pointer: no torch op, so no access the sanitizer sees",
    forms=("buggy", "declared", "upstream", "record_use"),
    also_buggy=("declared",),
)

NBYTES = 1 << 20


def execute(lib, dev, workspace, out, handle_stream, declare=False):
    """cudnn execute(): writes its workspace, works a while, reads it back,
    all by raw pointer; ``declare``: the wrapper states those accesses."""
    with dev.module.stream(handle_stream):
        lib.fill(workspace.data_ptr(), 0x3F, NBYTES, handle_stream)
        dev.slow()
        lib.copy(out.data_ptr(), workspace.data_ptr(), NBYTES, handle_stream)
        if declare:  # (imported above: an import here would delay the host past the slow kernel)
            declare_access(workspace, handle_stream, "write", "cudnn execute")
            declare_access(out, handle_stream, "write", "cudnn execute")


def program(dev, form):
    from npu_lifetime.corpus.device import RawLibrary

    M = dev.module
    lib = RawLibrary(dev)
    handle_stream = M.Stream()
    out = torch.zeros(NBYTES, dtype=torch.uint8, device=dev.type)
    if form == "upstream":
        with M.stream(handle_stream):  # the caller-owned workspace, on the launch stream
            workspace = torch.empty(NBYTES, dtype=torch.uint8, device=dev.type)
    else:
        workspace = torch.empty(NBYTES, dtype=torch.uint8, device=dev.type)  # on the ambient stream
    handle_stream.wait_stream(M.current_stream())  # the launch follows the ambient stream's work so far
    execute(lib, dev, workspace, out, handle_stream, declare=form == "declared")
    if form == "record_use":
        import npu_lifetime

        npu_lifetime.record_use(workspace, handle_stream)
    del workspace  # released when execute() returns
    scratch = torch.full((NBYTES,), 7, dtype=torch.uint8, device=dev.type)  # the next ambient allocation
    M.current_stream().wait_stream(handle_stream)
    del scratch
    return same(out, 0x3F)


if __name__ == "__main__":
    main(CASE, program)
