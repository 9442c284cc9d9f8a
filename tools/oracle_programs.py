"""Programs for the shim's oracle mode under compute-sanitizer
(tools/gpu_oracle.sh): each installs the shim (set NPU_LIFETIME_SHIM_ORACLE=1
for the oracle mode) and prints one JSON line.

  handoff  a hand-off the shim must get right: x is read on a side stream
           behind a slow kernel, record_use(x, side), x dropped, its memory
           wanted at once on the allocating stream
  buggy    the same hand-off without record_use: the program's bug, which
           compute-sanitizer must report through the shim's stream-ordered
           frees
  model    a real model: a small GPT-2 (transformers, random weights) trained
           3 steps, its batches prefetched on a copy stream with record_use
"""
import json
import sys

import torch

import npu_lifetime


def handoff(record=True):
    side = torch.cuda.Stream()
    out = []
    for _ in range(4):
        x = torch.full((1 << 20,), 3.0, device="cuda")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.cuda._sleep(20_000_000)
            out.append(x.sum())
        if record:
            npu_lifetime.record_use(x, side)
        del x
        y = torch.full((1 << 20,), -1.0, device="cuda")  # wants x's memory at once
        del y
    torch.cuda.synchronize()
    return {"sums": [float(v) for v in out]}


def model():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    net = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=1000, n_positions=64)).cuda()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    copy = torch.cuda.Stream()
    losses = []
    for step in range(3):
        host = torch.randint(0, 1000, (4, 64)).pin_memory()
        with torch.cuda.stream(copy):
            batch = host.to("cuda", non_blocking=True)
        torch.cuda.current_stream().wait_stream(copy)
        npu_lifetime.record_use(batch, torch.cuda.current_stream())
        loss = net(batch, labels=batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss))
        del batch
    return {"losses": losses}


if __name__ == "__main__":
    npu_lifetime.install("cuda")
    result = {"handoff": handoff, "buggy": lambda: handoff(record=False), "model": model}[sys.argv[1]]()
    result["oracle_mode"] = npu_lifetime.shim.stream_ordered()
    print(json.dumps(result))
