"""Events through the real torch_npu on the stand-in runtime: record, query,
synchronize, stream wait and elapsed time, with the recording stream's queue
held (paused) to show an event fires only when its stream reaches it.
Prints one JSON line.

    python tests/platforms/npu_programs/standin_events.py
"""
import json
import time

import torch
import torch_npu  # noqa: F401

import standin_controls as standin

DELAY_US = 20000


def held_record() -> dict:
    """An event recorded behind held work is not complete until the work ran."""
    x = torch.zeros(16, device="npu")
    side = torch.npu.Stream()
    torch.npu.synchronize()
    records = standin.calls("aclrtRecordEvent")
    event = torch.npu.Event()
    standin.pause(side)
    try:
        with torch.npu.stream(side):
            x.add_(1)
            event.record()
        reached = standin.wait_for(lambda: standin.calls("aclrtRecordEvent") > records)
        time.sleep(0.05)
        held = {"query": event.query(), "side_pending": standin.pending(side)}
        waiter = torch.npu.Stream()
        waiter.wait_event(event)
        with torch.npu.stream(waiter):
            y = x * 10
        time.sleep(0.05)
        held["waiter_pending"] = standin.pending(waiter)
    finally:
        standin.resume(side)
    event.synchronize()
    waiter.synchronize()
    return {"record_reached_runtime": reached, "while_held": held, "query_after": event.query(),
            "waiter_result": y.cpu()[:2].tolist(), "records": standin.calls("aclrtRecordEvent") - records}


def elapsed() -> dict:
    x = torch.zeros(16, device="npu")
    start, end = torch.npu.Event(enable_timing=True), torch.npu.Event(enable_timing=True)
    torch.npu.synchronize()
    standin.set_delay_us(DELAY_US)
    try:
        start.record()
        x.add_(1)
        x.add_(1)
        end.record()
        end.synchronize()
    finally:
        standin.set_delay_us(0)
    return {"elapsed_ms": start.elapsed_time(end), "query": [start.query(), end.query()],
            "delay_ms": DELAY_US / 1000}


def sleep_between() -> dict:
    """torch.npu._sleep(cycles) queues that long a kernel (aclnnSleep; the
    stand-in counts a cycle as a nanosecond)."""
    start, end = torch.npu.Event(enable_timing=True), torch.npu.Event(enable_timing=True)
    side = torch.npu.Stream()
    torch.npu.synchronize()
    with torch.npu.stream(side):
        start.record()
        torch.npu._sleep(30_000_000)
        end.record()
    end.synchronize()
    return {"elapsed_ms": start.elapsed_time(end), "slept_ms": 30.0}


def never_recorded() -> dict:
    event = torch.npu.Event()
    side = torch.npu.Stream()
    side.wait_event(event)
    with torch.npu.stream(side):
        y = torch.ones(4, device="npu") * 2
    side.synchronize()
    return {"query": event.query(), "after_wait": y.cpu().tolist()}


def main() -> dict:
    try:
        return {"held_record": held_record(), "elapsed": elapsed(), "sleep": sleep_between(),
                "never_recorded": never_recorded()}
    finally:
        standin.drain()


if __name__ == "__main__":
    print(json.dumps(main()))
