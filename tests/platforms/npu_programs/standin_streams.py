"""Cross-stream ordering on the stand-in runtime, through the real torch_npu.
A producer stream writes x while its queue is held (paused); a consumer
stream reads x. Without a wait the consumer runs first and reads the stale
value; after consumer.wait_stream(producer) it waits for the write. Prints
one JSON line.

    python tests/platforms/npu_programs/standin_streams.py
"""
import json
import time

import torch
import torch_npu  # noqa: F401

import standin_controls as standin

N = 1024


def scenario(wait: bool) -> dict:
    x = torch.zeros(N, device="npu")
    torch.npu.synchronize()
    producer, consumer = torch.npu.Stream(), torch.npu.Stream()
    standin.pause(producer)
    launched = standin.calls("aclnnMuls")
    try:
        with torch.npu.stream(producer):
            x.fill_(1.0)
        if wait:
            consumer.wait_stream(producer)
        with torch.npu.stream(consumer):
            y = x * 2
        reached = standin.wait_for(lambda: standin.calls("aclnnMuls") > launched)
        if not wait:
            consumer.synchronize()
        else:
            time.sleep(0.05)
        before = {"consumer_pending": standin.pending(consumer), "producer_pending": standin.pending(producer),
                  "y": y.cpu()[:4].tolist() if not wait else None}
    finally:
        standin.resume(producer)
    torch.npu.synchronize()
    consumer.synchronize()
    return {"launched": reached, "before_resume": before, "y": y.cpu()[:4].tolist(), "x": x.cpu()[:4].tolist()}


def same_stream() -> list:
    """With every task delayed, work on one stream stays in order."""
    x = torch.zeros(N, device="npu")
    for _ in range(5):
        x.add_(1)
    x.mul_(3)
    return x.cpu()[:4].tolist()


def main() -> dict:
    standin.set_delay_us(2000)
    try:
        return {"without_wait": scenario(wait=False), "with_wait_stream": scenario(wait=True),
                "same_stream": same_stream()}
    finally:
        standin.set_delay_us(0)
        standin.drain()


if __name__ == "__main__":
    print(json.dumps(main()))
