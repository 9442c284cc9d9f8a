"""vllm-project/vllm-ascend#13398, #13402 (fix: #13396): `inf` in Qwen3-30B RL sampling on Ascend.

In ``random_sample()`` the exponential noise ``q`` is allocated and filled on
the sampler's own stream (``global_stream()``), and the current stream only
waits for that stream before ``probs.div_(q)``: an ordering edge, but no
lifetime one.  When the host drops ``q``, its block goes back to the
sampling stream's pool while the division is still queued on the current
stream; the next decode step's ``q`` takes the block, and its multi-kernel
``exponential_()`` (uniform, neg, add, masked_fill, log, mul) overwrites the
old ``q`` mid-read.  A negative ``q`` makes ``0 / q = -0`` win the argmax:
an out-of-vocabulary token.  The fix records ``q`` on the current stream.
"""
import torch

from npu_lifetime.corpus.case import Case, main

CASE = Case(
    name="vllm_ascend_sampler_q",
    threads=("vllm-project/vllm-ascend#13398", "vllm-project/vllm-ascend#13402", "vllm-project/vllm-ascend#13396"),
    summary="sampling noise q made on the sampler stream, divided on the current stream, dropped unrecorded",
    finding="uncovered_free",
    producer="sampling", consumer="default", buffer="q",
)

VOCAB, STEPS = 4096, 3


def exponential_(q):
    """``exponential_()`` as Ascend runs it: several kernels in place, whose
    intermediate states (uniform, then negative) are what a reader of the
    old ``q`` sees when the block is reused under it."""
    q.uniform_()
    q.neg_()
    q.add_(1)
    q.log_()
    q.mul_(-1)


def program(dev, form):
    M = dev.module
    sampling = M.Stream()  # global_stream(): the sampler's stream
    logits = torch.randn(VOCAB, device=dev.type)
    sampled = []
    for _step in range(STEPS):  # decode steps, with no host sync between them (async scheduling)
        probs = logits.exp()
        probs.div_(probs.sum())  # softmax
        with M.stream(sampling):
            q = torch.empty_like(probs)
            exponential_(q)
        M.current_stream().wait_stream(sampling)  # the ordering edge the code had
        dev.slow()  # a long decode kernel ahead of the division
        probs.div_(q)
        if form == "upstream":
            dev.record_stream(q, M.current_stream())  # q.record_stream(torch.npu.current_stream())
        elif form == "record_use":
            import npu_lifetime

            npu_lifetime.record_use(q, M.current_stream())
        del q
        sampled.append(probs)
    # a negative q (0 / q = -0 wins the argmax), or NaN (the debug shim's poison)
    return all(int((p < 0).sum()) == 0 and int(torch.isfinite(p).sum()) == VOCAB for p in sampled)


if __name__ == "__main__":
    main(CASE, program)
