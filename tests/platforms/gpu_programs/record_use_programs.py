"""record_use on CUDA, each program in a fresh process: the torch-allocator fallback
(no shim) and the fast path under the shim.  The last stdout line is JSON."""
import json
import os
import sys
import time

import torch

import npu_lifetime
from npu_lifetime.recording import calls
from npu_lifetime.recording.torch_allocator_fallback import FALLBACK

SLEEP = 200_000_000  # cycles of torch.cuda._sleep: ~0.1 s, long enough to keep a stream busy


def counts() -> dict:
    return dict(FALLBACK.for_device("cuda").counts)


def fallback_allocation_stream() -> dict:
    main, side = torch.cuda.current_stream(), torch.cuda.Stream()
    x = torch.ones(1 << 16, device="cuda")
    with torch.cuda.stream(side):
        y = torch.ones(1 << 16, device="cuda")
    npu_lifetime.record_use(x)  # the current stream allocated it
    npu_lifetime.record_use(x, main)
    npu_lifetime.record_use(y, side)
    held_after_own = FALLBACK.held()
    npu_lifetime.record_use(y, main)  # another stream: held
    return {"held_after_own_streams": held_after_own, "held_after_other": FALLBACK.held(), **counts()}


def fallback_capture() -> dict:
    side = torch.cuda.Stream()
    busy = torch.ones(1 << 16, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP)
        busy.sum()
    npu_lifetime.record_use(busy, side)  # an eager entry, pending while the capture runs
    x = torch.ones(1 << 16, device="cuda")
    graph = torch.cuda.CUDAGraph()
    error = None
    try:
        with torch.cuda.graph(graph):
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                y = x * 2
            npu_lifetime.record_use(x, side)  # degrades to record_stream; records and queries nothing
            torch.cuda.current_stream().wait_stream(side)
        graph.replay()
        torch.cuda.synchronize()
    except Exception as err:  # reported, not raised: the test shows it
        error = f"{type(err).__name__}: {err}"
    torch.cuda.synchronize()
    released_after = _wait_until_released()  # the reaper polled through the capture: the gate kept it out
    return {"error": error, "replayed_ok": error is None and bool(torch.equal(y, x * 2)),
            "released_after_capture": released_after, "held_after": FALLBACK.held(), **counts()}


def _wait_until_released(timeout: float = 5.0) -> bool:
    """True once the fallback holds nothing, without a record_use call (its reaper thread)."""
    deadline = time.time() + timeout
    while FALLBACK.held() and time.time() < deadline:
        time.sleep(0.005)
    return FALLBACK.held() == 0


def _resize_round(with_record_use: bool) -> dict:
    """A slow side-stream read of x, then x's storage resized to 0 and the
    memory asked for again on the allocating stream and overwritten."""
    side = torch.cuda.Stream()
    n = 1 << 22
    x = torch.full((n,), 7.0, device="cuda")
    address = x.data_ptr()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP)
        copy = x.clone()  # the slow last read of x
    if with_record_use:
        npu_lifetime.record_use(x, side)
    x.untyped_storage().resize_(0)
    z = torch.empty(n, device="cuda")
    z.fill_(-1.0)  # on the allocating stream, while side still sleeps
    reused = z.data_ptr() == address
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        corrupted = not bool(torch.all(copy == 7.0))
    torch.cuda.synchronize()
    return {"reused": reused, "corrupted": corrupted}


def fallback_resize() -> dict:
    control = _resize_round(False)
    kept = _resize_round(True)
    return {"control": control, "record_use": kept, **counts()}


def fallback_cost(n: str = "1000") -> dict:
    """n storages with record_use pending on a sleeping side stream, then n
    more calls: how many event queries each call makes, and its time."""
    n = int(n)
    side = torch.cuda.Stream()
    tensors = [torch.ones(256, device="cuda") for _ in range(2 * n)]
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP * 10)
    for t in tensors[:n]:
        npu_lifetime.record_use(t, side)
    before = counts()["queries"]
    t0 = time.perf_counter()
    for t in tensors[n:]:
        npu_lifetime.record_use(t, side)
    seconds = time.perf_counter() - t0
    queries = counts()["queries"] - before
    torch.cuda.synchronize()
    return {"calls": n, "queries": queries, "us_per_call": seconds / n * 1e6, "held": FALLBACK.held()}


def fallback_fork(rounds: str = "10") -> dict:
    side = torch.cuda.Stream()
    outcomes = []
    for _ in range(int(rounds)):
        x = torch.ones(1 << 16, device="cuda")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.cuda._sleep(SLEEP // 10)
            x.sum()
        npu_lifetime.record_use(x, side)
        pid = os.fork()
        if pid == 0:  # no CUDA here: only the fallback's bookkeeping
            FALLBACK.held()
            os._exit(0)
        deadline = time.time() + 10
        while time.time() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                outcomes.append(os.waitstatus_to_exitcode(status))
                break
            time.sleep(0.01)
        else:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            outcomes.append("deadlocked")
    torch.cuda.synchronize()
    return {"outcomes": outcomes}


def fallback_released_without_another_call() -> dict:
    side = torch.cuda.Stream()
    x = torch.ones(1 << 20, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    x.sum()  # loads the reduction's module now: a first launch waits for the device (it hid the sleep below)
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP)
        x.sum()
    for _ in range(100):
        npu_lifetime.record_use(x, side)  # one live event per (storage, stream)
    held = FALLBACK.held()
    del x
    time.sleep(0.02)
    held_while_sleeping = FALLBACK.held()  # side still sleeps: held
    torch.cuda.synchronize()
    released = _wait_until_released()  # no further record_use call
    return {"held_while_pending": held, "held_while_sleeping": held_while_sleeping, "released": released,
            **counts()}


def fallback_out_of_memory_observer() -> dict:
    """With the reaper stopped, a storage whose event fired is released by
    the allocator's out-of-memory observer; the next allocation succeeds."""
    fallback = FALLBACK.for_device("cuda")
    fallback.background = False  # no reaper: only the observer may release
    fallback.stop_background()
    torch.cuda.set_per_process_memory_fraction(0.5)
    total = torch.cuda.get_device_properties(0).total_memory
    n = int(total * 0.3) // 4
    side = torch.cuda.Stream()
    x = torch.empty(n, device="cuda")
    npu_lifetime.record_use(x, side)  # side is idle: fires at once
    del x
    torch.cuda.synchronize()
    held_before = fallback.held()
    oom = False
    try:
        torch.empty(n, device="cuda")
    except torch.OutOfMemoryError:
        oom = True
    held_after = fallback.held()
    y = torch.empty(n, device="cuda")  # x's memory is back in the allocator's cache
    return {"held_before": held_before, "oom": oom, "held_after": held_after, "allocated_after": y.numel() == n,
            **counts()}


def fallback_raw_events() -> dict:
    """The table makes, records and queries raw CUDA events through torch's
    libcudart: a not-ready query leaves no error for torch's next launch
    check, and a use on the default stream (the legacy stream, handle 0) is
    recorded there and released once it fired."""
    table = FALLBACK.for_device("cuda")._table
    side = torch.cuda.Stream()
    x = torch.ones(1 << 20, device="cuda")
    x.sum()  # loads the reduction's module now (a first launch waits for the device)
    torch.cuda.synchronize()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP)
        x.sum()
    npu_lifetime.record_use(x, side)
    released_while_busy = FALLBACK.reclaim()  # not ready: queried on this thread
    error = None
    try:
        (x + 1).sum()  # torch checks cudaGetLastError after each launch
        torch.cuda.synchronize()
    except RuntimeError as err:
        error = f"{type(err).__name__}: {err}"
    released = _wait_until_released()
    with torch.cuda.stream(side):
        z = torch.ones(1 << 10, device="cuda")  # side's memory
    default = torch.cuda.default_stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP // 10)
    default.wait_stream(side)
    npu_lifetime.record_use(z, default)
    held_on_default = FALLBACK.held()
    torch.cuda.synchronize()
    return {"raw_events": table.uses_runtime, "default_handle": default.cuda_stream,
            "released_while_busy": released_while_busy, "error": error, "released": released,
            "held_on_default": held_on_default, "released_default": _wait_until_released(), **counts()}


def shim_fast_path() -> dict:
    """Under the shim: record_use never leaves the fast path, views work,
    and the shim attaches the event to the block."""
    npu_lifetime.install("cuda")
    from npu_lifetime import shim

    side = torch.cuda.Stream()
    x = torch.ones(1 << 16, device="cuda")
    npu_lifetime.record_use(x, side)  # the first call goes the checked way and enables the fast path
    slow = []
    original = calls._record_use_checked
    calls._record_use_checked = lambda *a: (slow.append(a), original(*a))
    npu_lifetime.record_use(x[100:200], side)
    with torch.cuda.stream(side):
        npu_lifetime.record_use(x)
    calls._record_use_checked = original
    blocks = [b for seg in shim.snapshot()["segments"] for b in seg["blocks"] if b["address"] == x.data_ptr()]
    streams = [e["stream"] for e in blocks[0]["use_events"]] if blocks else []
    torch.cuda.synchronize()
    return {"slow_calls": len(slow), "use_event_streams": streams, "side": side.cuda_stream,
            "findings": shim.findings()}


PROGRAMS = {name: fn for name, fn in globals().items() if name.startswith(("fallback_", "shim_"))}

if __name__ == "__main__":
    print(json.dumps(PROGRAMS[sys.argv[1]](*sys.argv[2:])))
