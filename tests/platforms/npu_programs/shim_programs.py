"""The product against the real torch_npu, over the stand-in CANN runtime
(tests/platforms/npu_standin).  Each program runs in a fresh process of the torch_npu
environment (the allocator can only be swapped before the first NPU
allocation) and prints one JSON line.

    python tests/platforms/npu_programs/shim_programs.py PROGRAM [ARGS...]
"""
import ctypes
import json
import sys
import time

import torch
import torch_npu  # noqa: F401  (torch.npu)

import standin_controls as standin
import npu_lifetime
from npu_lifetime import shim

N = 1 << 18  # 1 MiB of float32


def handle(stream) -> int:
    from npu_lifetime.shim import npu_queue

    return npu_queue.stream_handle(stream)


def _processed_events_left_nothing_pending() -> bool:
    shim.process_events()
    return shim.stats()["pending.all.current"] == 0


def block_of(ptr: int) -> dict:
    return next(b for s in shim.snapshot()["segments"] for b in s["blocks"] if b["address"] == ptr)


def basics(policy: str = "lazy_wait") -> dict:
    """Tensors through the shim, record_stream reaching it, empty_cache."""
    setup = npu_lifetime.install("npu", policy=policy)
    a = torch.ones(N, device="npu")
    b = (a * 3 + a).cpu()
    side = torch.npu.Stream()
    x = torch.empty(N, device="npu")
    x.record_stream(side)
    recorded = block_of(x.data_ptr())["recorded_streams"]
    ptr = x.data_ptr()
    del x
    torch.npu.synchronize()
    shim.process_events()
    before = shim.stats()["reserved_bytes.all.current"]
    torch.npu.empty_cache()
    return {"runtime": shim.runtime_name(), "hooks": list(setup.hooks), "values_ok": bool((b == 4).all()),
            "recorded": recorded, "side": handle(side), "ptr_was_shim": ptr != 0,
            "reserved_before_empty_cache": before, "reserved_after": shim.stats()["reserved_bytes.all.current"],
            "allocations": shim.stats()["allocation.all.allocated"], "findings": shim.findings()}


def ordering(policy: str, events: str = "queued") -> dict:
    """An event the shim records (record_use) while the user's kernel still
    sits in torch_npu's task queue: is it ordered after that kernel?  The
    stand-in holds torch_npu's launch thread (standin_hold_launches), so the
    kernel stays on the host.  Once the event is recorded the side stream
    is paused: a kernel launched after that runs only when the test resumes
    it, after the main stream's next owner wrote the block.
    ``events="direct"``: the shim without the queue operations (the NPU
    bridge still resolves streams): its events go straight to ACL."""
    if events == "direct":
        from npu_lifetime.shim import npu_queue
        from npu_lifetime.shim.libnpl import library

        def connect_without_queue_ops(lib):
            npu_queue._bridge = lib
            library().npl_set_npu_stream_resolver(ctypes.cast(lib.npl_npu_resolve_stream, ctypes.c_void_p).value)

        npu_queue.connect = connect_without_queue_ops
    npu_lifetime.install("npu", policy=policy)
    side = torch.npu.Stream()
    x = torch.ones(N, device="npu")
    torch.npu.synchronize()
    ptr = x.data_ptr()
    standin.hold_launches(True)
    with torch.npu.stream(side):
        y = x * 2  # queued on the host behind the held launch
    npu_lifetime.record_use(x, side)
    del x
    standin.wait_for(_processed_events_left_nothing_pending, timeout=0.5)  # an event that can fire fires
    pending_after_free = shim.stats()["pending.all.current"]
    standin.pause(handle(side))  # the bridge's handle: Stream.npu_stream would drain the held queue
    waits = shim.stats()["stream_waits"]
    z = torch.full((N,), 5.0, device="npu")  # main stream: reuses x's block only if that is safe
    reused = z.data_ptr() == ptr
    waited = shim.stats()["stream_waits"] > waits  # the main stream waits on the side stream's event
    standin.hold_launches(False)
    if not waited:
        torch.npu.current_stream().synchronize()  # z's fill has run; y's kernel has not (side paused)
    standin.resume(handle(side))
    torch.npu.synchronize()
    return {"pending_after_free": pending_after_free, "reused": reused, "waited": waited,
            "y_ok": bool((y.cpu() == 2).all()), "z_ok": bool((z.cpu() == 5).all()), "findings": shim.findings()}


def memory_functions() -> dict:
    """torch.npu's memory functions under the shim: the shim's figures under
    torch's names, no abort."""
    npu_lifetime.install("npu")
    x = torch.empty(N, device="npu")
    y = torch.empty(3 * N, device="npu")
    stats = shim.stats()
    got = {
        "memory_allocated": torch.npu.memory_allocated(),
        "max_memory_allocated": torch.npu.max_memory_allocated(),
        "memory_reserved": torch.npu.memory_reserved(),
        "memory_stats_allocated": torch.npu.memory_stats()["allocated_bytes.all.current"],
    }
    want = {"memory_allocated": stats["allocated_bytes.all.current"],
            "max_memory_allocated": stats["allocated_bytes.all.peak"],
            "memory_reserved": stats["reserved_bytes.all.current"],
            "memory_stats_allocated": stats["allocated_bytes.all.current"]}
    del y
    torch.npu.reset_peak_memory_stats()
    peak_after_reset = torch.npu.max_memory_allocated()
    segments = torch.npu.memory_snapshot()
    summary = torch.npu.memory_summary()
    torch.npu.set_per_process_memory_fraction(0.5)
    fraction = shim.memory_fraction(0)
    torch.npu.empty_cache()
    del x
    return {"got": got, "want": want, "peak_after_reset": peak_after_reset,
            "allocated_now": shim.stats()["allocated_bytes.all.current"],
            "snapshot_segments": len(segments), "summary_has_title": "PyTorch CUDA memory summary" in summary
            or "memory summary" in summary.lower(), "fraction": fraction}


def out_of_memory(cap_mib: str) -> dict:
    """Past the stand-in's memory cap: torch's out-of-memory error, and the
    program goes on."""
    npu_lifetime.install("npu")
    kept = torch.ones(N, device="npu")
    error = None
    try:
        torch.empty(int(cap_mib) * (1 << 20), dtype=torch.uint8, device="npu")
    except torch.OutOfMemoryError as err:
        error = str(err).splitlines()[0]
    after = torch.ones(N, device="npu") + kept
    return {"error": error, "goes_on": bool((after.cpu() == 2).all()), "num_ooms": shim.stats()["num_ooms"]}


def record_use_shim() -> dict:
    """record_use under the shim: one use event per stream on the block."""
    npu_lifetime.install("npu", policy="poll")
    side = torch.npu.Stream()
    x = torch.ones(N, device="npu")
    side.wait_stream(torch.npu.current_stream())  # x's fill first: without it the read raced (y wrong in ~1 of 3 runs)
    with torch.npu.stream(side):
        y = x * 2
    npu_lifetime.record_use(x, side)
    events = block_of(x.data_ptr())["use_events"]
    del x
    torch.npu.synchronize()
    shim.process_events()
    return {"events": events, "side": handle(side), "y_ok": bool((y.cpu() == 2).all()),
            "pending": shim.stats()["pending.all.current"], "findings": shim.findings()}


def record_use_fallback() -> dict:
    """record_use over torch_npu's own caching allocator (no shim): the
    storage is held while the side stream's read is pending (the stand-in
    holds that stream), and released once it ran, without another
    record_use call (the fallback's reaper)."""
    from npu_lifetime.recording import torch_allocator_fallback

    side = torch.npu.Stream()
    x = torch.ones(N, device="npu")
    torch.npu.synchronize()
    standin.pause(side)
    with torch.npu.stream(side):
        y = x * 2
    npu_lifetime.record_use(x, side)
    del x
    time.sleep(0.05)  # the reaper polls every few ms: the event cannot have fired
    held_while_paused = torch_allocator_fallback.FALLBACK.held()
    standin.resume(side)
    torch.npu.synchronize()
    standin.wait_for(lambda: torch_allocator_fallback.FALLBACK.held() == 0, timeout=5)
    return {"held_while_paused": held_while_paused, "held_after": torch_allocator_fallback.FALLBACK.held(),
            "y_ok": bool((y.cpu() == 2).all())}


def record_use_fallback_misuse() -> dict:
    """record_use over torch_npu's own allocator with what it cannot take:
    each refused with a RecordUseError saying what to pass, nothing held;
    then the fast path (no checked-path call) for a proper call."""
    from npu_lifetime import simdevice
    from npu_lifetime.recording import calls, torch_allocator_fallback

    side = torch.npu.Stream()
    x = torch.ones(N, device="npu")
    freed = torch.ones(N, device="npu")
    freed.untyped_storage().resize_(0)
    cases = {"stream str": (x, "side"), "stream simdevice": (x, simdevice.Stream()), "tensor list": ([1.0], side),
             "freed storage": (freed, side), "stream int": (x, 7)}
    errors = {}
    for name, (tensor, stream) in cases.items():
        try:
            npu_lifetime.record_use(tensor, stream)
            errors[name] = None
        except Exception as err:  # noqa: BLE001 - the type and words are the result
            errors[name] = f"{type(err).__name__}: {err}"
    held_after_misuse = torch_allocator_fallback.FALLBACK.held()
    npu_lifetime.record_use(torch.ones(8, device="npu"), side)  # the first call enables the fast path
    torch.npu.synchronize()
    standin.wait_for(lambda: torch_allocator_fallback.FALLBACK.held() == 0, timeout=5)
    checked = []
    original = calls._record_use_checked
    calls._record_use_checked = lambda *args: (checked.append(args), original(*args))[1]
    standin.pause(side)  # the event stays pending: held until resumed
    try:
        npu_lifetime.record_use(x, side)
    finally:
        calls._record_use_checked = original
    held_after_call = torch_allocator_fallback.FALLBACK.held()
    standin.resume(side)
    return {"errors": errors, "held_after_misuse": held_after_misuse, "checked_calls": len(checked),
            "held_after_call": held_after_call}


def expandable() -> dict:
    """Expandable segments from PYTORCH_NPU_ALLOC_CONF=expandable_segments:True
    (the test sets it), over the stand-in's virtual memory: a tensor crossing
    a page edge grows the segment in place, kernels read and write it right,
    empty_cache unmaps the free pages at the end."""
    npu_lifetime.install("npu")
    a = torch.ones(15 * N, device="npu")  # 15 MiB: the first 20 MiB page
    b = torch.full((10 * N,), 2.0, device="npu")  # [15, 25) MiB: a second page mapped after the first
    in_place = b.data_ptr() == a.data_ptr() + 15 * (1 << 20)
    values_ok = bool(((a + 1).cpu() == 2).all()) and bool(((b[-N:] * 2).cpu() == 4).all())
    torch.npu.synchronize()
    large = [s for s in shim.snapshot()["segments"] if s["pool"] == "large"]
    before = shim.stats()["reserved_bytes.all.current"]
    del b
    torch.npu.synchronize()
    torch.npu.empty_cache()
    after = shim.stats()["reserved_bytes.all.current"]
    values_ok = values_ok and bool((a.cpu() == 1).all())
    return {"large_segments": len(large), "large_expandable": sum(s["is_expandable"] for s in large),
            "in_place": in_place, "values_ok": values_ok, "reserved_before": before, "reserved_after": after,
            "expandable_setting": shim.expandable_segments(), "findings": shim.findings()}


class _QueueOps(ctypes.Structure):
    """struct npl_queue_ops (npu_lifetime_shim.h), as the NPU bridge fills it."""
    _fields_ = [(name, ctypes.c_void_p) for name in (
        "event_create", "event_destroy", "event_record", "event_query", "event_synchronize", "stream_wait_event",
        "stream_synchronize", "stream_drain", "device_synchronize", "error_string")]


def _foreign_stream(acl, device: int) -> int:
    """A stream of DEVICE made straight through ACL: torch_npu does not manage it."""
    stream = ctypes.c_void_p()
    with torch.npu.device(device):
        assert acl.aclrtCreateStream(ctypes.byref(stream)) == 0
    return stream.value


def foreign_stream_device() -> dict:
    """(issue 37) The NPU bridge's fallbacks for a stream torch_npu does not
    manage (event_record, stream_synchronize, stream_drain) synchronised the
    current device (0 here) instead of the stream's (1): its work was still
    running after them.  Each op is called as the shim calls it, with slow
    work queued on a device-1 stream made straight through ACL."""
    npu_lifetime.install("npu")
    from npu_lifetime.shim import npu_queue

    torch.ones(1, device="npu:0")
    acl = standin.library()
    acl.aclrtMemsetAsync.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int32, ctypes.c_size_t,
                                     ctypes.c_void_p]
    ops = _QueueOps.from_address(npu_queue._bridge.npl_npu_queue_ops())
    event_create = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int)(ops.event_create)
    event_record = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)(ops.event_record)
    on_stream = {name: ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)(getattr(ops, name))
                 for name in ("stream_synchronize", "stream_drain")}
    target = torch.empty(1 << 16, dtype=torch.uint8, device="npu:1")
    met, never_met = _foreign_stream(acl, 1), _foreign_stream(acl, 1)
    event = ctypes.c_void_p()
    assert event_create(ctypes.byref(event), 1) == 0

    def slow_work(stream):
        with torch.npu.device(1):
            for _ in range(3):
                assert acl.aclrtMemsetAsync(target.data_ptr(), target.numel(), 0, target.numel(), stream) == 0

    done, codes = {}, {}
    standin.set_delay_us(100_000)  # each task on a stream takes 0.1 s
    try:
        for op, stream in (("event_record", met), ("stream_synchronize", met), ("stream_drain", met),
                           ("stream_synchronize_never_met", never_met)):
            slow_work(stream)
            if op == "event_record":
                codes[op] = event_record(event, stream)
            else:
                codes[op] = on_stream[op.replace("_never_met", "")](stream)
            done[op] = acl.standin_tasks_pending(stream) == 0
    finally:
        standin.set_delay_us(0)
    current = ctypes.c_int32(-1)
    acl.aclrtGetDevice(ctypes.byref(current))
    return {"done": done, "codes": codes, "current_device": torch.npu.current_device(),
            "acl_current_device": current.value, "findings": shim.findings()}


def cross_stream() -> dict:
    """A block freed on one torch_npu stream, then an allocation of its size
    on another: whether the second stream got the first one's segment
    (the mode comes from NPU_LIFETIME_CROSS_STREAM_REUSE)."""
    npu_lifetime.install("npu")
    first, second = torch.npu.Stream(), torch.npu.Stream()
    with torch.npu.stream(first):
        x = torch.empty(N, device="npu")
        x.fill_(1.0)
        ptr = x.data_ptr()
        del x
    with torch.npu.stream(second):
        y = torch.empty(N, device="npu")
        y.fill_(2.0)
    torch.npu.synchronize()
    s = shim.stats()
    return {"mode": shim.cross_stream_reuse(), "same_address": y.data_ptr() == ptr, "y_ok": bool((y.cpu() == 2).all()),
            "cross_stream_segments": s["cross_stream_segments"], "stream_waits": s["stream_waits"],
            "findings": shim.findings()}


PROGRAMS = {f.__name__: f for f in (basics, ordering, memory_functions, out_of_memory, record_use_shim,
                                    record_use_fallback, record_use_fallback_misuse, expandable,
                                    foreign_stream_device, cross_stream)}

if __name__ == "__main__":
    print(json.dumps(PROGRAMS[sys.argv[1]](*sys.argv[2:])))
