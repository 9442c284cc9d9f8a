"""A built-in hand-off on the shim's simulated runtime, for pictures on a
machine without a GPU (``npu-lifetime snapshot --demo``).

Three simulated streams: COMPUTE allocates, COMM and SIDE use its blocks.
A simulated stream's events fire only when ``sim.complete`` says its queued
work finished, so each step below says what the GPU would have done.
"""
from __future__ import annotations

from ..shim import api

COMPUTE, COMM, SIDE = 0x10, 0x20, 0x30
STREAM_NAMES = {COMPUTE: "compute", COMM: "comm", SIDE: "side"}
MIB = 1 << 20


def run() -> None:
    """Leaves two blocks live and one still waiting on COMM, for the picture."""
    api.select_runtime("sim")
    api.set_policy("poll")
    sim = api.sim

    # 1. record_use right after COMM's last read: the free waits for that read only
    a = api.alloc(MIB, 0, COMPUTE)
    api.record_use(a, COMM)
    sim.complete(COMM)  # the read finished
    api.free(a, MIB, 0, COMPUTE)

    # 2. record_stream: the event is recorded at the free, so it also waits for
    #    whatever COMM queued after its last read
    b = api.alloc(MIB, 0, COMPUTE)  # polls: a is reusable, b takes its address
    api.record_stream(b, COMM)
    sim.complete(COMM)  # b's read finished; COMM queues more work
    api.free(b, MIB, 0, COMPUTE)
    c = api.alloc(MIB, 0, COMPUTE)  # b still waits on COMM: c gets other memory
    api.record_use(c, SIDE)
    sim.complete(COMM)  # COMM's later work finished too
    api.process_events()  # only now b is reusable

    # 3. the lazy-wait policy: a block freed with a pending record_use event goes
    #    back to the cache at once; whoever takes it next waits GPU-side for SIDE
    api.set_policy("lazy_wait")
    e = api.alloc(MIB, 0, COMPUTE)
    api.record_use(e, SIDE)
    api.free(e, MIB, 0, COMPUTE)
    f = api.alloc(MIB, 0, COMPUTE)  # e's block, behind a wait on SIDE's event
    api.free(f, MIB, 0, COMPUTE)

    # 4. a double free: reported, nothing else happens
    api.free(f, MIB, 0, COMPUTE)

    # 5. a missing hand-off: COMM reads d and nothing records it; the sanitizer
    #    tells the shim (note_use), so the free is a finding and is held
    api.set_policy("poll")
    d = api.alloc(MIB, 0, COMPUTE)
    api.note_use(d, COMM)
    api.free(d, MIB, 0, COMPUTE)
    api.alloc(2 * MIB, 0, COMPUTE)  # a large block, live at the end
