"""The oracle mode on the simulated runtime: each eager block is a
stream-ordered allocation of its own, freed stream-ordered on its stream
once the shim makes it reusable, after that stream waited on the block's
events.  The simulated runtime's stream-ordered free counts work other
streams still have queued on the memory as illegal accesses (as
compute-sanitizer reports a use-after-free), so a use the shim forgot shows
here as it would on the GPU: a program's missing record_use does, and so
does a shim built to release blocks without waiting (a deliberate mutant)."""
import json
import os
import subprocess
import sys

import pytest

from npu_lifetime import shim
from helpers.shim_testing import build_shim, check_invariants

S1, S2 = 0x1000, 0x2000
N = 1 << 20


def _handoff(record_use: bool) -> dict:
    """S1 allocates, S2 writes it (a queued kernel), S1 frees it: with or
    without record_use on S2.  What the simulated device saw."""
    shim.set_stream_ordered(True)
    before = shim.sim.illegal_accesses()
    ptr = shim.alloc(N, 0, S1)
    assert shim.sim.fill(S2, ptr, 7, N)  # queued: S2 has not run
    if record_use:
        shim.record_use(ptr, S2)
    shim.free(ptr, N, 0, S1)
    stats = shim.stats()
    result = {"illegal": shim.sim.illegal_accesses() - before, "reserved": stats["reserved_bytes.all.current"],
              "freed_segments": stats["num_device_free"]}
    shim.sim.complete_all()
    check_invariants()
    return result


def test_each_block_is_its_own_stream_ordered_allocation(sim_shim):
    shim.set_stream_ordered(True)
    assert shim.stream_ordered() and shim.policy() == "stream_wait"
    a, b = shim.alloc(1000, 0, S1), shim.alloc(1000, 0, S1)
    stats = shim.stats()
    assert stats["segment.all.current"] == 2 and stats["reserved_bytes.all.current"] == 2 * 1024  # no 2 MiB segment
    shim.free(a, 1000, 0, S1)
    assert shim.stats()["reserved_bytes.all.current"] == 1024  # given back at once: never cached
    c = shim.alloc(1000, 0, S1)
    assert shim.stats()["num_device_alloc"] == 3  # a new allocation, not a reuse
    for ptr in (b, c):
        shim.free(ptr, 1000, 0, S1)
    assert shim.stats()["reserved_bytes.all.current"] == 0
    check_invariants()


def test_a_recorded_use_is_waited_for_before_the_free(sim_shim):
    seen = _handoff(record_use=True)
    assert seen == {"illegal": 0, "reserved": 0, "freed_segments": 1}, seen


def test_a_missing_record_use_is_an_illegal_access(sim_shim):
    """The program's bug: its block goes back while S2's write is queued."""
    seen = _handoff(record_use=False)
    assert seen["illegal"] == 1 and seen["freed_segments"] == 1, seen


def test_the_mode_changes_only_while_no_memory_is_held(sim_shim):
    ptr = shim.alloc(1000, 0, S1)
    with pytest.raises(RuntimeError, match="holds no memory"):
        shim.set_stream_ordered(True)
    shim.free(ptr, 1000, 0, S1)
    shim.empty_cache()
    shim.set_stream_ordered(True)
    shim.set_stream_ordered(False)
    assert not shim.stream_ordered()


def test_a_premature_release_is_caught(tmp_path):
    """A shim built to release blocks without waiting on their events: the
    correct program (record_use) now shows the illegal access."""
    library = build_shim(tmp_path, "-DNPL_MUTANT_ORDERED_RELEASE")
    program = (
        "import json, sys; sys.path[:0] = [%r, %r]\n"
        "from npu_lifetime import shim\n"
        "import test_shim_oracle_mode as t\n"
        "shim.reset(); shim.select_runtime('sim')\n"
        "print(json.dumps(t._handoff(record_use=True)))\n" % (os.path.dirname(__file__), os.path.dirname(os.path.dirname(__file__))))
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, NPU_LIFETIME_SHIM=str(library)))
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["illegal"] == 1
