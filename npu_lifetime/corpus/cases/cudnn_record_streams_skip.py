"""NVIDIA/cudnn-frontend#1183 (review; the same class fixed in #1182 and #1185): a ``record_streams()`` helper that skips the current stream.

The helper records tensors on the launch stream only when that stream is not
torch's current stream, assuming the current stream is where they were
allocated.  A caller that makes the launch stream current (``with
torch.cuda.stream(launch)``) and passes a tensor made on another stream gets
nothing recorded: the staging copy ``x.contiguous()`` is queued on the
launch stream behind a long kernel, the caller releases ``x``, and the
allocator hands its block to the next allocation on ``x``'s stream, which
overwrites it before the copy reads it.  The fix records the original on the
launch stream whether or not it is current.
"""
import torch

from npu_lifetime.corpus.case import Case, main

CASE = Case(
    name="cudnn_record_streams_skip",
    threads=("NVIDIA/cudnn-frontend#1183", "NVIDIA/cudnn-frontend#1182"),
    summary="staging copy on the (current) launch stream reads x; x released with nothing recorded",
    finding="uncovered_free",
    producer="default", consumer="launch", buffer="x",
)

N = 1 << 16


def record_streams(dev, tensors, stream, form):
    """The helper: a no-op for torch's current stream (the bug)."""
    if form == "buggy" and stream == dev.module.current_stream():
        return
    for t in tensors:
        if form == "record_use":
            import npu_lifetime

            npu_lifetime.record_use(t, stream)
        else:
            dev.record_stream(t, stream)


def program(dev, form):
    M = dev.module
    launch = M.Stream()
    x = torch.arange(N, dtype=torch.float32, device=dev.type)  # the caller's tensor
    launch.wait_stream(M.current_stream())
    with M.stream(launch):
        dev.slow()  # the long kernel already queued on the handle's stream
        staged = x.view(-1, 2).t().contiguous()  # contiguous_on_stream(): the staging copy reads x
        record_streams(dev, [x], launch, form)
    del x  # the caller releases the original
    poison = torch.full((N,), float("nan"), device=dev.type)  # a same-size allocation on x's stream
    M.current_stream().wait_stream(launch)
    expected = torch.arange(N, dtype=torch.float32, device=dev.type).view(-1, 2).t().contiguous()
    del poison
    return bool(torch.equal(staged, expected))


if __name__ == "__main__":
    main(CASE, program)
