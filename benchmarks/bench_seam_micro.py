"""The seam's per-call cost on CPU (simulated device), in one process: the
common op through _dispatch.c's fast path (``a.add_(1)``), and a device
event handler called directly (``on_event_record`` + ``on_event_wait``:
since the seam, the sanitizer's method delegating to its EventFeed).
Thread CPU time, medians of 7; run it on two checkouts alternately
(PYTHONPATH=<checkout>) to compare them.

    python benchmarks/bench_seam_micro.py LABEL
"""
import statistics, sys, time, torch
from npu_lifetime import simdevice as sd
from npu_lifetime.sanitizer import LifetimeSanitizer
torch.set_num_threads(1)
def per_op(n=3000):
    san = LifetimeSanitizer("sim", on_race="collect", warn_on_free=False)
    with san:
        a = torch.ones(64); s = sd.Stream()
        t0 = time.thread_time()
        for _ in range(n):
            a.add_(1)
        return (time.thread_time() - t0) / n * 1e6
def per_event(n=20000):
    san = LifetimeSanitizer("sim", on_race="collect", warn_on_free=False)
    key = (0, 5); rec, wait = san.on_event_record, san.on_event_wait
    t0 = time.thread_time()
    for i in range(n):
        rec("e", key); wait("e", key)
    return (time.thread_time() - t0) / n / 2 * 1e6
ops = [per_op() for _ in range(7)]; ev = [per_event() for _ in range(7)]
label = sys.argv[1] if len(sys.argv) > 1 else "this checkout"
print(f"{label}: op {statistics.median(ops):.2f} us, event {statistics.median(ev):.3f} us")
