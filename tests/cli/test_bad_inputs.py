"""Every bad input to the public API gives one clear error and changes nothing
(issue 10, item 1).

One row per case: the call, what it must give (an exception type; a
finding the shim reports instead, for what only the shim can see; or the
CLI's exit code), a regex the message must match, and what must hold
afterwards.  Before and after each API row the observable state is taken
(the shim's runtime, policy, debug flag, memory fraction, statistics and
blocks; what ``install`` set up; torch's routed memory functions; the
record_use routes; FSDP2's patches) and must be equal.  A CLI row that
exits 2 must not have run the script or written a file.

The sanitizer, ``check`` and ``fuzz`` are being rebuilt on another branch;
their rows come after that merge.
"""
from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Union

import pytest
import torch

import npu_lifetime
from npu_lifetime import fsdp2, memory, shim
from npu_lifetime.recording import calls as rec
from npu_lifetime import simdevice as sd
from npu_lifetime.cli import main
from npu_lifetime.schedules.fuzz import FuzzConfig
from npu_lifetime.handoff import RecordUseHandoff, SimHandoffDevice, run_handoff
from npu_lifetime.recording import RecordUseError
from npu_lifetime.sanitizer import LifetimeSanitizer
from npu_lifetime.schedules import Adopt, Alloc, Schedule, ScheduleError
from npu_lifetime.shim import ShimError
from npu_lifetime.shim import install as install_module
from npu_lifetime.shim.install import InstallError
from npu_lifetime.viz.recorder import Recorder

S1, S2 = 0x1000, 0x2000  # simulated stream handles
NO_CUDA = not torch.cuda.is_available()
FEWER_THAN_2_GPUS = torch.cuda.device_count() < 2
try:
    import torch_npu  # noqa: F401

    NO_TORCH_NPU = False
except ImportError:
    NO_TORCH_NPU = True


class CudaLikeStream:
    """What a torch.cuda.Stream looks like to the shim's int-only API."""

    cuda_stream = S2


@dataclass(frozen=True)
class Row:
    id: str
    call: Callable  # (ctx) -> None, or the CLI's exit code
    gives: Union[type, int, str]  # an exception type; a CLI exit code; "finding:KIND" (the shim reports it)
    match: str  # regex the message (CLI: stderr, then stdout) must match
    when: bool = True  # False: the machine has what the row needs not to have (a GPU, torch_npu)
    ran: Optional[bool] = None  # CLI: whether the script ran (None: exit 2 means no, else not checked)
    setup: Optional[Callable] = None  # (ctx) -> None, before the state is taken
    finding: Optional[str] = None  # the kind the shim also reports for an exception row that reached it


class Ctx:
    """What a row needs: a live and a freed shim block, CPU tensors (one
    with a freed storage), a simulated stream, scripts in a scratch
    directory."""

    def __init__(self, tmp_path, monkeypatch, request) -> None:
        self.tmp = tmp_path
        self.monkeypatch = monkeypatch
        self.request = request
        self.exits: contextlib.ExitStack = contextlib.ExitStack()
        self.marker = tmp_path / "ran.txt"
        self.s = sd.Stream()
        self.x = torch.ones(8)
        self.freed = torch.ones(8)
        self.freed.untyped_storage().resize_(0)
        self.block = shim.alloc(4096, 0, S1)  # live on S1
        self.freed_block = shim.alloc(8192, 0, S1)
        shim.free(self.freed_block, 8192, 0, S1)

    def fake_acl(self) -> str:
        """A loadable ACL runtime library (conftest's fake_ascendcl build)."""
        return str(self.request.getfixturevalue("fake_acl_library")[0])

    def script(self, name: str, body: str = "") -> str:
        path = self.tmp / name
        if not path.exists():
            path.write_text(f"open({str(self.marker)!r}, 'a').write('ran')\n{body}")
        return str(path)


def cli(*argv) -> Callable:
    """A CLI row's call: ``npu-lifetime ARGV`` in this process; script
    names (``ok.py``, ...) are made in the scratch directory."""
    def call(ctx: Ctx) -> int:
        return main([_scratch_arg(ctx, a) for a in argv])

    call.argv = argv
    return call


SCRIPTS = {
    "ok.py": "print('the script ran')",
    "raises.py": "raise ValueError('boom')",
    "exit3.py": "import sys\nsys.exit(3)",
    "exitmsg.py": "import sys\nsys.exit('the script says why')",
    "interrupted.py": "raise KeyboardInterrupt",
    "osexit0.py": "import os\nprint('the script ran')\nos._exit(0)\nprint('never')",
    "osexit5.py": "import os\nos._exit(5)",
    "osexit_race.py": "import os, torch\nfrom npu_lifetime import simdevice as sd\nside = sd.Stream()\n"
                      "x = torch.ones(1000)\nwith sd.stream(side):\n    y = x * 2\ndel x\nos._exit(0)",
}


def _scratch_arg(ctx: Ctx, arg: str) -> str:
    if arg in SCRIPTS:
        return ctx.script(arg, SCRIPTS[arg])
    if arg == "syntax.py":
        path = ctx.tmp / arg
        path.write_text("def f(:\n")
        return str(path)
    if arg == "adir":
        (ctx.tmp / arg).mkdir(exist_ok=True)
        return str(ctx.tmp / arg)
    if arg.startswith("SCRATCH/"):
        return str(ctx.tmp / arg[len("SCRATCH/"):])
    return arg


def cli_process(*argv, env: dict) -> Callable:
    """A CLI row run as its own process (for what one process can load once)."""
    def call(ctx: Ctx) -> int:
        done = subprocess.run([sys.executable, "-m", "npu_lifetime.cli", *(_scratch_arg(ctx, a) for a in argv)],
                              capture_output=True, text=True,
                              env={**os.environ, **env}, cwd=ctx.tmp, timeout=120)
        sys.stdout.write(done.stdout)
        sys.stderr.write(done.stderr)
        return done.returncode

    call.argv = argv
    return call


def enter(ctx: Ctx, manager) -> None:
    ctx.exits.enter_context(manager)


def recording(ctx: Ctx) -> None:
    ctx.recorder = Recorder().start()
    ctx.exits.callback(ctx.recorder.stop, "the row's recording")




def bench_script(ctx: Ctx, body: str) -> int:
    """A benchmark that fails its own way, run as ``bench`` runs one."""
    from npu_lifetime.cli import _run_benchmark

    path = ctx.tmp / "bench_fake.py"
    path.write_text(body)
    return _run_benchmark("fake", str(path), [])


def unknown_storage_through_the_shim(ctx: Ctx) -> None:
    route = rec.simulated_route(lambda stream: stream.handle + 1)
    with rec.shim_route(route):
        npu_lifetime.record_use(torch.ones(8), ctx.s)  # host memory the shim never handed out


def fingerprints_of_another_version(ctx: Ctx) -> None:
    ctx.monkeypatch.setattr(fsdp2, "fingerprints", lambda: {"_fsdp_collectives:foreach_reduce": "0" * 16})
    fsdp2.check_version()


# -- the rows ------------------------------------------------------------------------------------------------
SHIM_ROWS = [
    # alloc
    Row("alloc size str", lambda c: shim.alloc("10"), TypeError, r"size must be a number of bytes .* not str '10'"),
    Row("alloc size float", lambda c: shim.alloc(1.5), TypeError, r"size must be .* not float 1\.5"),
    Row("alloc size None", lambda c: shim.alloc(None), TypeError, r"size must be .* not NoneType"),
    Row("alloc size bool", lambda c: shim.alloc(True), TypeError, r"size must be .* not the bool True"),
    Row("alloc size negative", lambda c: shim.alloc(-1, 0, S1), ValueError, r"size must be .*int >= 0.*not -1"),
    Row("alloc size 2**63", lambda c: shim.alloc(1 << 63, 0, S1), ValueError,
        r"size must be .* not 9223372036854775808"),
    Row("alloc device negative", lambda c: shim.alloc(64, -1, S1), ValueError, r"device must be a device index .* -1"),
    Row("alloc device 2**40", lambda c: shim.alloc(64, 1 << 40, S1), ValueError, r"device must be .* 1099511627776"),
    Row("alloc device str", lambda c: shim.alloc(64, "0", S1), TypeError, r"device must be a device index .* str '0'"),
    Row("alloc stream str", lambda c: shim.alloc(64, 0, "s1"), TypeError, r"stream must be a stream handle .*str 's1'"),
    Row("alloc stream negative", lambda c: shim.alloc(64, 0, -1), ValueError, r"stream must be .* not -1"),
    Row("alloc stream 2**64", lambda c: shim.alloc(64, 0, 1 << 64), ValueError, r"stream must be .*2\*\*64"),
    Row("alloc stream object", lambda c: shim.alloc(64, 0, CudaLikeStream()), TypeError,
        r"stream must be the runtime's stream handle .* pass its \.cuda_stream"),
    # free
    Row("free ptr str", lambda c: shim.free("0x10", 64, 0, S1), TypeError, r"ptr must be an address .* str '0x10'"),
    Row("free ptr None", lambda c: shim.free(None, 64, 0, S1), TypeError, r"ptr must be an address .* NoneType"),
    Row("free ptr negative", lambda c: shim.free(-4096, 64, 0, S1), ValueError, r"ptr must be an address .* -4096"),
    Row("free ptr tensor", lambda c: shim.free(torch.ones(2), 8, 0, S1), TypeError,
        r"ptr must be an address \(an int, e\.g\. tensor\.untyped_storage\(\)\.data_ptr\(\)\)"),
    Row("free size negative", lambda c: shim.free(c.block, -1, 0, S1), ValueError, r"size must be .* not -1"),
    Row("free stream object", lambda c: shim.free(c.block, 4096, 0, CudaLikeStream()), TypeError,
        r"pass its \.cuda_stream"),
    Row("free unknown pointer", lambda c: shim.free(0xDEAD000, 64, 0, S1), "finding:unknown_pointer", ""),
    Row("free twice", lambda c: shim.free(c.freed_block, 8192, 0, S1), "finding:double_free", "already freed"),
    Row("free interior pointer", lambda c: shim.free(c.block + 512, 4096, 0, S1), "finding:interior_pointer", ""),
    # record_stream / record_use / note_use / erase_stream
    Row("record_stream ptr str", lambda c: shim.record_stream("p", S2), TypeError, r"ptr must be an address"),
    Row("record_stream stream str", lambda c: shim.record_stream(c.block, "s2"), TypeError,
        r"stream must be a stream handle"),
    Row("record_stream stream object", lambda c: shim.record_stream(c.block, CudaLikeStream()), TypeError,
        r"pass its \.cuda_stream"),
    Row("record_stream stream_device -2", lambda c: shim.record_stream(c.block, S2, -2), ValueError,
        r"stream_device must be a device index .*or -1, not -2"),
    Row("record_stream unknown pointer", lambda c: shim.record_stream(0xBAD000, S2), "finding:unknown_pointer", ""),
    Row("record_stream stream 0 on the simulated runtime", lambda c: shim.record_stream(c.block, 0), ValueError,
        r"^record_stream: stream 0 is no stream under the simulated runtime \(its streams are non-zero handles\): "
        r"pass the handle of the stream that uses the block$"),
    Row("record_use stream 0 on the simulated runtime", lambda c: shim.record_use(c.block, 0), ValueError,
        r"^record_use: stream 0 is no stream under the simulated runtime"),
    Row("note_use stream 0 on the simulated runtime", lambda c: shim.note_use(c.block, 0), ValueError,
        r"^note_use: stream 0 is no stream under the simulated runtime"),
    Row("erase_stream stream 0 on the simulated runtime", lambda c: shim.erase_stream(c.block, 0), ValueError,
        r"^erase_stream: stream 0 is no stream under the simulated runtime"),
    Row("record_stream freed block", lambda c: shim.record_stream(c.freed_block, S2), "finding:use_after_free", ""),
    Row("record_use ptr None", lambda c: shim.record_use(None, S2), TypeError, r"ptr must be an address"),
    Row("record_use stream float", lambda c: shim.record_use(c.block, 2.0), TypeError,
        r"stream must be a stream handle .* float 2\.0"),
    Row("record_use stream_device str", lambda c: shim.record_use(c.block, S2, "0"), TypeError,
        r"stream_device must be a device index"),
    Row("record_use unknown pointer", lambda c: shim.record_use(0xBAD000, S2), "finding:unknown_pointer", ""),
    Row("record_use freed block", lambda c: shim.record_use(c.freed_block, S2), "finding:use_after_free", ""),
    Row("note_use ptr float", lambda c: shim.note_use(1.0, S2), TypeError, r"ptr must be an address"),
    Row("note_use unknown pointer", lambda c: shim.note_use(0xBAD000, S2), "finding:unknown_pointer", ""),
    Row("erase_stream ptr str", lambda c: shim.erase_stream("p", S2), TypeError, r"ptr must be an address"),
    Row("erase_stream stream negative", lambda c: shim.erase_stream(c.block, -1), ValueError,
        r"stream must be .* not -1"),
    Row("erase_stream unknown pointer", lambda c: shim.erase_stream(0xBAD000, S2), "finding:unknown_pointer", ""),
    # policy, debug, trace, memory fraction
    Row("set_policy int", lambda c: shim.set_policy(1), TypeError,
        r"policy must be a str \(lazy_wait, poll, stream_wait\)"),
    Row("set_policy list", lambda c: shim.set_policy([]), TypeError, r"policy must be a str .* not list"),
    Row("set_policy None", lambda c: shim.set_policy(None), TypeError, r"policy must be a str"),
    Row("set_policy unknown", lambda c: shim.set_policy("eventually"), ValueError,
        r"unknown policy 'eventually'; expected one of \['lazy_wait', 'poll', 'stream_wait'\]"),
    Row("set_debug str", lambda c: shim.set_debug("yes"), TypeError, r"enabled must be True or False, not str"),
    Row("set_debug int", lambda c: shim.set_debug(1), TypeError, r"enabled must be True or False, not int 1"),
    Row("set_debug quarantine str", lambda c: shim.set_debug(True, "1M"), TypeError,
        r"quarantine_bytes must be an int >= 0, not str '1M'"),
    Row("set_debug quarantine negative", lambda c: shim.set_debug(True, -1), ValueError,
        r"quarantine_bytes must be an int in \[0, 2\*\*64\), not -1"),
    Row("set_debug quarantine 2**64", lambda c: shim.set_debug(True, 1 << 64), ValueError,
        r"quarantine_bytes must be an int in \[0, 2\*\*64\)"),
    Row("set_debug quarantine float", lambda c: shim.set_debug(False, 1.5), TypeError, r"quarantine_bytes must be"),
    Row("set_graph_capture_record_stream_reuse str", lambda c: shim.set_graph_capture_record_stream_reuse("True"),
        TypeError, r"enabled must be True or False, not str"),
    Row("set_trace str", lambda c: shim.set_trace("on"), TypeError, r"enabled must be True or False"),
    Row("set_trace capacity negative", lambda c: shim.set_trace(True, -1), ValueError, r"capacity must be .* -1"),
    Row("set_trace capacity float", lambda c: shim.set_trace(True, 2.5), TypeError, r"capacity must be .* float"),
    Row("set_memory_fraction str", lambda c: shim.set_memory_fraction("half"), TypeError,
        r"memory fraction must be a number in \[0, 1\], not str 'half'"),
    Row("set_memory_fraction nan", lambda c: shim.set_memory_fraction(float("nan")), ValueError,
        r"memory fraction must be in \[0, 1\] \(1: the whole device\), not nan"),
    Row("set_memory_fraction 1.5", lambda c: shim.set_memory_fraction(1.5), ValueError, r"not 1\.5"),
    Row("set_memory_fraction negative", lambda c: shim.set_memory_fraction(-0.1), ValueError, r"not -0\.1"),
    Row("set_memory_fraction bool", lambda c: shim.set_memory_fraction(True), TypeError, r"not bool True"),
    Row("set_memory_fraction device -1", lambda c: shim.set_memory_fraction(0.5, -1), ValueError,
        r"device must be a device index \(an int >= 0\), not -1"),
    Row("memory_fraction device str", lambda c: shim.memory_fraction("0"), TypeError, r"device must be"),
    # runtime
    Row("select_runtime unknown", lambda c: shim.select_runtime("tpu"), ShimError,
        r"unknown runtime 'tpu' \(expected cuda, acl, sim or auto\)"),
    Row("select_runtime None", lambda c: shim.select_runtime(None), TypeError,
        r"the runtime must be a str \(cuda, acl, sim, auto\), not NoneType"),
    Row("select_runtime int", lambda c: shim.select_runtime(3), TypeError, r"the runtime must be a str"),
    Row("select_runtime library for sim", lambda c: shim.select_runtime("sim", "/x/libascendcl.so"), ValueError,
        r"library_path is for the acl runtime .* not for 'sim'"),
    Row("select_runtime library missing", lambda c: shim.select_runtime("acl", "/nonexistent/libascendcl.so"),
        ShimError, r"cannot select runtime 'acl': (cannot open /nonexistent/libascendcl\.so|the ACL runtime is "
                   r"already loaded in this process .*cannot switch to /nonexistent/libascendcl\.so)"),
    Row("select_runtime library int", lambda c: shim.select_runtime("acl", 3), TypeError,
        r"library_path must be a path \(a str or os\.PathLike\), not int 3"),
    Row("select_runtime while holding memory", lambda c: shim.select_runtime("acl", c.fake_acl()), ShimError,
        r"holds memory \(free its blocks and call npu_lifetime\.shim\.empty_cache\(\) first\)"),
    # statistics
    Row("stats device str", lambda c: shim.stats("cuda"), TypeError, r"device must be a device index .* str 'cuda'"),
    Row("stats torch.device", lambda c: shim.stats(torch.device("cpu")), TypeError, r"not device device"),
    Row("stats device negative", lambda c: shim.stats(-1), ValueError, r"device must be .* not -1"),
    Row("reset_peak device negative", lambda c: shim.reset_peak(-1), ValueError, r"device must be"),
    Row("reset_accumulated device str", lambda c: shim.reset_accumulated("0"), TypeError, r"device must be"),
    # graph pools and claims
    Row("begin pool of one", lambda c: shim.begin_allocate_to_pool(0, (1,)), TypeError,
        r"pool must be a graph pool id \(a pair of ints, as torch's graph_pool_handle\(\)\), not tuple \(1,\)"),
    Row("begin pool str", lambda c: shim.begin_allocate_to_pool(0, "ab"), TypeError, r"pool must be a graph pool id"),
    Row("begin pool negative", lambda c: shim.begin_allocate_to_pool(0, (-1, 0)), ValueError,
        r"pool\[0\] must be an int in \[0, 2\*\*64\), not -1"),
    Row("begin pool stream str", lambda c: shim.begin_allocate_to_pool(0, (1, 0), "s"), TypeError,
        r"stream must be a stream handle"),
    Row("end pool None", lambda c: shim.end_allocate_to_pool(0, None), TypeError, r"pool must be a graph pool id"),
    Row("release pool of three", lambda c: shim.release_pool(0, (1, 2, 3)), TypeError, r"pool must be"),
    Row("pool_live_allocations None", lambda c: shim.pool_live_allocations(0, None), TypeError, r"pool must be"),
    Row("claim_next unknown", lambda c: shim.claim_next(0x1234), ValueError,
        r"claim_next\(0x1234\): no cached block .* holds this address"),
    Row("claim_next live block", lambda c: shim.claim_next(c.block), ValueError, r"no cached block"),
    Row("claim_next str", lambda c: shim.claim_next("0x1234"), TypeError, r"ptr must be an address"),
    Row("base_allocation str", lambda c: shim.base_allocation("p"), TypeError, r"ptr must be an address"),
    # the simulated runtime's controls
    Row("sim.complete str", lambda c: shim.sim.complete("s1"), TypeError, r"stream must be a stream handle"),
    Row("sim.set_memory_limit negative", lambda c: shim.sim.set_memory_limit(-1), ValueError,
        r"nbytes must be an int in \[0, 2\*\*64\), not -1"),
    Row("sim.set_device negative", lambda c: shim.sim.set_device(-1), ValueError, r"device must be .* not -1"),
    Row("sim.set_capturing str", lambda c: shim.sim.set_capturing(S1, "yes"), TypeError,
        r"capturing must be True or False"),
    Row("sim.stream_waits None", lambda c: shim.sim.stream_waits(None), TypeError, r"stream must be a stream handle"),
    Row("sim.complete_to negative", lambda c: shim.sim.complete_to(S1, -1), ValueError,
        r"position must be an int in \[0, 2\*\*64\), not -1"),
    Row("sim.launch str", lambda c: shim.sim.launch("s1"), TypeError, r"stream must be a stream handle"),
    Row("sim.capture_frontier str", lambda c: shim.sim.capture_frontier("s1"), TypeError,
        r"stream must be a stream handle"),
    Row("sim.node_parents negative", lambda c: shim.sim.node_parents(-1), ValueError,
        r"node must be a graph node handle .* not -1"),
    Row("sim.record_event None", lambda c: shim.sim.record_event(None), TypeError, r"stream must be a stream handle"),
    Row("sim.wait_event event None", lambda c: shim.sim.wait_event(S1, None), TypeError,
        r"event must be an event handle \(an int, from sim\.record_event\), not NoneType"),
]

RECORDING_ROWS = [
    Row("record_use list", lambda c: npu_lifetime.record_use([1, 2], c.s), RecordUseError,
        r"^record_use needs a tensor, not list$"),
    Row("record_use None", lambda c: npu_lifetime.record_use(None), RecordUseError, r"needs a tensor, not NoneType"),
    Row("record_use storage", lambda c: npu_lifetime.record_use(c.x.untyped_storage(), c.s), RecordUseError,
        r"needs a tensor, not UntypedStorage"),
    Row("record_use cpu + int stream", lambda c: npu_lifetime.record_use(c.x, 3), RecordUseError,
        r"a CPU tensor takes a simdevice stream \(npu_lifetime\.simdevice\), not 3; for a device stream"),
    Row("record_use cpu + str stream", lambda c: npu_lifetime.record_use(c.x, "side"), RecordUseError,
        r"takes a simdevice stream"),
    Row("record_use cpu + torch.Stream", lambda c: npu_lifetime.record_use(c.x, torch.Stream(device="cpu")),
        RecordUseError, r"takes a simdevice stream \(npu_lifetime\.simdevice\), not torch\.Stream"),
    Row("record_use freed storage", lambda c: npu_lifetime.record_use(c.freed, c.s), RecordUseError,
        r"record_use on a freed storage .*resize_\(0\).*call it before the storage is freed"),
    Row("record_use freed storage, no stream", lambda c: npu_lifetime.record_use(c.freed), RecordUseError,
        r"freed storage"),
    Row("record_use meta tensor", lambda c: npu_lifetime.record_use(torch.ones(2, device="meta")), RecordUseError,
        r"needs a cuda or npu tensor \(or a CPU tensor with a simdevice stream\); this one is on meta"),
    Row("record_use meta + simdevice stream", lambda c: npu_lifetime.record_use(torch.ones(2, device="meta"), c.s),
        RecordUseError, r"a simdevice stream goes with CPU tensors, not a tensor on meta"),
    # record_use on a sparse tensor is no bad input since issue 36: it records the tensors holding its memory
    # (tests/sanitizer/test_sanitizer_odd_tensors.py)
    Row("record_use memory the shim does not know", unknown_storage_through_the_shim, RecordUseError,
        r"the shim does not know the storage at 0x[0-9a-f]+ \(cpu\): it was allocated before",
        finding="unknown_pointer"),
    Row("record_stream list", lambda c: npu_lifetime.record_stream([1], c.s), RecordUseError,
        r"^record_stream needs a tensor, not list$"),
    Row("record_stream list + int", lambda c: npu_lifetime.record_stream([1], 3), RecordUseError,
        r"record_stream needs a tensor"),
    Row("record_stream cpu + None", lambda c: npu_lifetime.record_stream(c.x, None), RecordUseError,
        r"record_stream needs a stream \(the stream that uses the tensor\), not None"),
    Row("record_stream cpu + int", lambda c: npu_lifetime.record_stream(c.x, 3), RecordUseError,
        r"a CPU tensor takes a simdevice stream .* for a device stream, record_stream a cuda or npu tensor"),
    Row("record_stream cpu + torch.Stream", lambda c: npu_lifetime.record_stream(c.x, torch.Stream(device="cpu")),
        RecordUseError, r"takes a simdevice stream"),
    Row("record_stream freed storage", lambda c: npu_lifetime.record_stream(c.freed, c.s), RecordUseError,
        r"record_stream on a freed storage"),
    Row("record_stream meta + simdevice stream", lambda c: npu_lifetime.record_stream(torch.ones(2, device="meta"),
                                                                                          c.s),
        RecordUseError, r"simdevice stream goes with CPU tensors, not meta"),
    Row("erase_stream list", lambda c: npu_lifetime.erase_stream([1], 3), RecordUseError,
        r"^erase_stream needs a tensor, not list$"),
    Row("erase_stream list + simdevice stream", lambda c: npu_lifetime.erase_stream([1], c.s), RecordUseError,
        r"erase_stream needs a tensor"),
    Row("erase_stream cpu + int", lambda c: npu_lifetime.erase_stream(c.x, 3), RecordUseError,
        r"erase_stream on a CPU tensor takes a simdevice stream .* a device stream needs the shim"),
    Row("erase_stream cpu + None", lambda c: npu_lifetime.erase_stream(c.x, None), RecordUseError,
        r"takes a simdevice stream .*not None"),
    Row("erase_stream freed storage", lambda c: npu_lifetime.erase_stream(c.freed, c.s), RecordUseError,
        r"erase_stream on a freed storage"),
    Row("erase_stream meta tensor", lambda c: npu_lifetime.erase_stream(torch.ones(2, device="meta"),
                                                                         torch.Stream(device="cpu")),
        RecordUseError, r"erase_stream needs a cuda or npu tensor .* this one is on meta"),
]

MEMORY_ROWS = [
    Row("memory_allocated -1", lambda c: memory.memory_allocated(-1), ValueError, r"device must be .* not -1"),
    Row("memory_allocated float", lambda c: memory.memory_allocated(1.5), TypeError, r"not float 1\.5"),
    Row("memory_allocated bool", lambda c: memory.memory_allocated(True), TypeError, r"not the bool True"),
    Row("memory_allocated list", lambda c: memory.memory_allocated([]), TypeError, r"not list"),
    Row("memory_allocated unknown name", lambda c: memory.memory_allocated("bogus"), ValueError,
        r"device must be an index, a torch\.device or a str such as 'cuda:0', 'npu:1' or 'cpu', not 'bogus'"),
    Row("memory_allocated cuda without install", lambda c: memory.memory_allocated("cuda:1"), ValueError,
        r"device 'cuda:1' is a cuda device; the shim is not installed for a device .* 'cpu' or an index"),
    Row("memory_stats meta", lambda c: memory.memory_stats(torch.device("meta")), ValueError, r"is a meta device"),
    Row("max_memory_reserved -3", lambda c: memory.max_memory_reserved(-3), ValueError, r"not -3"),
    Row("memory_pending str index", lambda c: memory.memory_pending("0"), ValueError, r"not '0'"),
    Row("reset_peak_memory_stats npu without install", lambda c: memory.reset_peak_memory_stats("npu"), ValueError,
        r"not 'npu'|'npu' is a npu device"),
    Row("reset_accumulated_memory_stats float", lambda c: memory.reset_accumulated_memory_stats(0.0), TypeError,
        r"not float"),
    Row("set_per_process_memory_fraction str", lambda c: memory.set_per_process_memory_fraction("x"), TypeError,
        r"memory fraction must be a number"),
    Row("set_per_process_memory_fraction 2", lambda c: memory.set_per_process_memory_fraction(2), ValueError,
        r"must be in \[0, 1\]"),
    Row("set_per_process_memory_fraction device -1", lambda c: memory.set_per_process_memory_fraction(0.5, -1),
        ValueError, r"device must be"),
    Row("get_per_process_memory_fraction bogus", lambda c: memory.get_per_process_memory_fraction("tpu:0"),
        ValueError, r"not 'tpu:0'"),
]

INSTALL_ROWS = [
    Row("install cpu", lambda c: npu_lifetime.install("cpu"), ValueError,
        r"device must be one of \['cuda', 'npu'\], not 'cpu'; .*select_runtime\('sim'\)"),
    Row("install sim", lambda c: npu_lifetime.install("sim", policy="stream_wait"), ValueError, r"not 'sim'"),
    Row("install cuda:0", lambda c: npu_lifetime.install("cuda:0"), ValueError,
        r"not 'cuda:0': the shim serves every cuda device of the process, install\('cuda'\)"),
    Row("install NPU", lambda c: npu_lifetime.install("NPU"), ValueError, r"install\('npu'\)"),
    Row("install torch.device", lambda c: npu_lifetime.install(torch.device("cuda")), TypeError,
        r"device must be 'cuda' or 'npu' \(a device type, as a str\), not device"),
    Row("install None", lambda c: npu_lifetime.install(None), TypeError, r"not NoneType None"),
    Row("install policy unknown", lambda c: npu_lifetime.install("cuda", policy="eventually"), ValueError,
        r"policy must be one of \['lazy_wait', 'poll', 'stream_wait'\], not 'eventually'"),
    Row("install policy list", lambda c: npu_lifetime.install("cuda", policy=[]), TypeError,
        r"policy must be a str"),
    Row("install policy None", lambda c: npu_lifetime.install("cuda", policy=None), TypeError, r"policy must be"),
    Row("install debug int", lambda c: npu_lifetime.install("cuda", debug=1), TypeError,
        r"debug must be True or False, not int 1"),
    Row("install debug str", lambda c: npu_lifetime.install("cuda", debug="yes"), TypeError, r"debug must be"),
    Row("install quarantine negative", lambda c: npu_lifetime.install("cuda", debug=True, quarantine_bytes=-1),
        ValueError, r"quarantine_bytes must be an int in \[0, 2\*\*64\), not -1"),
    Row("install quarantine bool", lambda c: npu_lifetime.install("cuda", quarantine_bytes=True), TypeError,
        r"quarantine_bytes must be an int >= 0, not the bool True"),
    Row("install quarantine float", lambda c: npu_lifetime.install("cuda", quarantine_bytes=1e6), TypeError,
        r"quarantine_bytes must be"),
    Row("install misspelt option", lambda c: npu_lifetime.install("cuda", polcy="poll"), TypeError,
        r"unexpected keyword argument 'polcy'"),
    Row("install cuda without CUDA", lambda c: npu_lifetime.install("cuda", policy="stream_wait", debug=True),
        InstallError, r"install\('cuda'\) needs a CUDA device; none is available .*select_runtime\('sim'\)",
        when=NO_CUDA),
    Row("shim.install.install cuda without CUDA", lambda c: install_module.install("cuda", "stream_wait", True),
        InstallError, r"needs a CUDA device", when=NO_CUDA),
    Row("install npu without torch_npu", lambda c: npu_lifetime.install("npu", policy="stream_wait", debug=True),
        InstallError, r"install\('npu'\) needs torch_npu, which cannot be imported here .* Ascend NPU",
        when=NO_TORCH_NPU),
]

FSDP2_ROWS = [
    Row("Handoffs unknown mode", lambda c: fsdp2.Handoffs("bogus"), ValueError, r"mode must be one of .* not 'bogus'"),
    Row("Handoffs instrument str", lambda c: fsdp2.Handoffs(fsdp2.RECORD_USE, "x"), TypeError,
        r"instrument must be an npu_lifetime\.fsdp2\.Instrument, not str 'x'"),
    Row("Instrument hook not callable", lambda c: fsdp2.Instrument(before_last_read=3), TypeError,
        r"Instrument\.before_last_read must be a function or None, not int 3"),
    Row("use_record_use instrument dict", lambda c: enter(c, fsdp2.use_record_use({})), TypeError,
        r"instrument must be an npu_lifetime\.fsdp2\.Instrument, not dict"),
    Row("use_record_use inside use_record_use", lambda c: enter(c, fsdp2.use_record_use()), RuntimeError,
        r"already patched \(mode 'record_use', by another Handoffs or use_record_use block\): leave that block",
        setup=lambda c: enter(c, fsdp2.use_record_use())),
    Row("Handoffs enabled while another is", lambda c: fsdp2.Handoffs(fsdp2.RECORD_USE).enable(), RuntimeError,
        r"already patched \(mode 'recipe'", setup=lambda c: enter(c, fsdp2.Handoffs(fsdp2.RECIPE))),
    Row("FSDP2 of another version", fingerprints_of_another_version, fsdp2.FSDP2VersionError,
        r"this FSDP2 differs from the versions the record_use migration knows .* differs in"),
]

HARNESS_ROWS = [
    Row("run_handoff layers 0", lambda c: run_handoff(SimHandoffDevice(), RecordUseHandoff, layers=0), ValueError,
        r"layers must be at least 1, not 0"),
    Row("run_handoff width str", lambda c: run_handoff(SimHandoffDevice(), RecordUseHandoff, width="8"), TypeError,
        r"width must be an int >= 1, not str '8'"),
    Row("run_handoff steps bool", lambda c: run_handoff(SimHandoffDevice(), RecordUseHandoff, steps=True),
        TypeError, r"steps must be an int"),
    Row("run_handoff heavy negative", lambda c: run_handoff(SimHandoffDevice(), RecordUseHandoff, heavy=-1),
        ValueError, r"heavy must be at least 0"),
    Row("run_handoff not a hand-off", lambda c: run_handoff(SimHandoffDevice(), str), TypeError,
        r"handoff_class must be a Handoff subclass"),
    Row("run_handoff not a device", lambda c: run_handoff("sim", RecordUseHandoff), TypeError,
        r"device must be a SimHandoffDevice or CudaHandoffDevice"),
]

RECORDER_ROWS = [
    Row("Recorder capacity str", lambda c: Recorder("1M"), TypeError,
        r"the trace capacity must be an int \(events\), not str '1M'"),
    Row("Recorder capacity 0", lambda c: Recorder(0), ValueError, r"must be at least 1 event, not 0"),
    Row("Recorder started twice", lambda c: c.recorder.start(), RuntimeError,
        r"already recording: stop\(\) it before starting it again", setup=recording),
    Row("Recorder stopped before it started", lambda c: Recorder().stop("x"), RuntimeError,
        r"not recording: start\(\) it first"),
]

FUZZ_ROWS = [  # the fuzzer and its schedule language
    Row("Schedule negative size", lambda c: Schedule(2, 0, (Alloc(0, 0, 0, -4),)), ScheduleError,
        r"^step 0 Alloc\(tensor=0, stream=0, address=0, size=-4\): size must be at least 1 cell, not -4$"),
    Row("Schedule adopted size 0", lambda c: Schedule(2, 0, (Adopt(0, 1, 8, 0),)), ScheduleError,
        r"size must be at least 1 cell, not 0"),
    Row("Schedule negative address", lambda c: Schedule(2, 0, (Alloc(0, 0, -8),)), ScheduleError,
        r"address must be at least 0, not -8"),
    Row("Schedule size str", lambda c: Schedule(2, 0, (Alloc(0, 0, 0, "4"),)), ScheduleError,
        r"size must be an int \(cells\), not str '4'"),
    Row("Schedule no streams", lambda c: Schedule(0, 0, ()), ScheduleError,
        r"^Schedule: streams must be at least 1, not 0$"),
    Row("Schedule devices 0", lambda c: Schedule(2, 0, (), devices=0), ScheduleError,
        r"devices must be at least 1, not 0"),
    Row("Schedule events negative", lambda c: Schedule(2, -1, ()), ScheduleError, r"events must be at least 0, not -1"),
    Row("Schedule streams float", lambda c: Schedule(2.0, 0, ()), TypeError, r"streams must be an int, not float 2\.0"),
    Row("FuzzConfig schedules negative", lambda c: FuzzConfig(schedules=-1), ValueError,
        r"^FuzzConfig: schedules must be at least 1, not -1$"),
    Row("FuzzConfig jobs 0", lambda c: FuzzConfig(jobs=0), ValueError, r"jobs must be at least 1, not 0"),
    Row("FuzzConfig max_steps str", lambda c: FuzzConfig(max_steps="5"), TypeError,
        r"max_steps must be an int >= 1, not str '5'"),
    Row("FuzzConfig max_events negative", lambda c: FuzzConfig(max_events=-1), ValueError,
        r"max_events must be at least 0, not -1"),
    Row("FuzzConfig seed float", lambda c: FuzzConfig(seed=1.5), TypeError, r"seed must be an int, not float 1\.5"),
    Row("FuzzConfig misuse str", lambda c: FuzzConfig(misuse="no"), TypeError,
        r"misuse must be True or False, not str 'no'"),
]

SIMDEVICE_ROWS = [
    Row("simdevice.stream str", lambda c: enter(c, sd.stream("side")), TypeError,
        r"^simdevice\.stream takes a simdevice Stream \(npu_lifetime\.simdevice\.Stream\(\)\) or None, not str "
        r"'side': make the stream once with simdevice\.Stream\(\) and pass it$"),
    Row("simdevice.stream torch.Stream", lambda c: enter(c, sd.stream(torch.Stream(device="cpu"))), TypeError,
        r"simdevice\.stream takes a simdevice Stream .* not torch\.Stream"),
    Row("simdevice.set_stream int", lambda c: sd.set_stream(1), TypeError,
        r"simdevice\.set_stream takes a simdevice Stream .* not int 1"),
    Row("Stream.wait_event a stream", lambda c: c.s.wait_event(sd.Stream()), TypeError,
        r"^Stream\.wait_event takes a simdevice Event \(npu_lifetime\.simdevice\.Event\(\)\), not the stream "
        r"<sim stream \d+>: to wait for a stream, use wait_stream$"),
    Row("Stream.wait_event None", lambda c: c.s.wait_event(None), TypeError,
        r"Stream\.wait_event takes a simdevice Event .* not None"),
    Row("Stream.wait_stream None", lambda c: c.s.wait_stream(None), TypeError,
        r"^Stream\.wait_stream takes a simdevice Stream \(npu_lifetime\.simdevice\.Stream\(\)\), not None$"),
    Row("Stream.wait_stream an event", lambda c: c.s.wait_stream(sd.Event()), TypeError,
        r"wait_stream takes a simdevice Stream .* not the event .*: to wait for an event, use wait_event"),
    Row("Stream.record_event a stream", lambda c: c.s.record_event(sd.Stream()), TypeError,
        r"Stream\.record_event takes a simdevice Event .* or None"),
    Row("Event.record str", lambda c: sd.Event().record("side"), TypeError,
        r"Event\.record takes a simdevice Stream .* or None, not str 'side'"),
    Row("Event.wait an event", lambda c: sd.Event().wait(sd.Event()), TypeError,
        r"Event\.wait takes a simdevice Stream .* or None, not the event"),
    Row("Tensor.record_stream a simdevice stream", lambda c: c.x.record_stream(c.s), TypeError,
        r"^Tensor\.record_stream takes a torch stream \(torch\.cuda\.Stream, torch\.npu\.Stream\); for a simdevice "
        r"stream call npu_lifetime\.record_stream\(tensor, stream\)"),
    Row("Tensor.record_stream a torch stream: torch's own answer", lambda c: c.x.record_stream(torch.Stream("cpu")),
        NotImplementedError, r"Could not run 'aten::record_stream' with arguments from the 'CPU' backend"),
]

SANITIZER_ROWS = [
    Row("LifetimeSanitizer stack_depth str", lambda c: LifetimeSanitizer("sim", stack_depth="deep"), TypeError,
        r"^stack_depth must be an int >= 0 \(user frames kept per site; 0: none\), not str 'deep'$"),
    Row("LifetimeSanitizer stack_depth negative", lambda c: LifetimeSanitizer("sim", stack_depth=-1), ValueError,
        r"stack_depth must be an int >= 0 .* not -1"),
    Row("LifetimeSanitizer stack_depth float", lambda c: LifetimeSanitizer("sim", stack_depth=8.0), TypeError,
        r"stack_depth must be an int >= 0 .* not float 8\.0"),
]

CLI_ROWS = [
    Row("no command", cli(), 2, r"the following arguments are required: command"),
    Row("unknown command", cli("bogus"), 2, r"invalid choice: 'bogus'"),
    # snapshot: refused before anything runs
    Row("snapshot nothing to run", cli("snapshot"), 2, r"give a script to run, or --demo \(not both\)"),
    Row("snapshot script and --demo", cli("snapshot", "--demo", "ok.py"), 2, r"give a script to run, or --demo"),
    Row("snapshot missing script", cli("snapshot", "--device", "sim", "SCRATCH/missing.py"),
        2, r"no such script: .*missing\.py"),
    Row("snapshot a directory", cli("snapshot", "--device", "sim", "adir"),
        2, r"adir is a directory: give the Python script to run"),
    Row("snapshot not a file", cli("snapshot", "--device", "sim", "/dev/null"), 2, r"/dev/null is not a regular file"),
    Row("snapshot unknown device", cli("snapshot", "--device", "tpu", "ok.py"), 2,
        r"argument --device: invalid choice: 'tpu'"),
    Row("snapshot --device cuda without CUDA", cli("snapshot", "--device", "cuda", "ok.py"), 2,
        r"--device cuda: install\('cuda'\) needs a CUDA device", when=NO_CUDA),
    Row("snapshot --device npu without torch_npu", cli("snapshot", "--device", "npu", "ok.py"), 2,
        r"--device npu: install\('npu'\) needs torch_npu", when=NO_TORCH_NPU),
    Row("snapshot unknown policy", cli("snapshot", "--device", "sim", "--policy", "eventually", "ok.py"), 2,
        r"argument --policy: invalid choice: 'eventually'"),
    Row("snapshot trace capacity 0", cli("snapshot", "--device", "sim", "--trace-capacity", "0", "ok.py"), 2,
        r"argument --trace-capacity: must be at least 1, not 0"),
    Row("snapshot trace capacity word", cli("snapshot", "--device", "sim", "--trace-capacity", "lots", "ok.py"), 2,
        r"argument --trace-capacity: must be a whole number >= 1, not 'lots'"),
    Row("snapshot max events negative", cli("snapshot", "--device", "sim", "--max-events", "-1", "ok.py"), 2,
        r"argument --max-events: must be at least 1, not -1"),
    Row("snapshot out in a missing directory",
        cli("snapshot", "--device", "sim", "--out", "SCRATCH/nowhere/pics", "ok.py"), 2,
        r"cannot write .*nowhere/pics\.pickle: no directory .*nowhere; give --out PREFIX in an existing directory"),
    Row("snapshot out in a read-only directory", cli("snapshot", "--device", "sim", "--out", "/proc/sys/pics", "ok.py"),
        2,
        r"/proc/sys is not writable; give --out PREFIX in a writable directory",
        when=not os.access("/proc/sys", os.W_OK)),
    Row("snapshot out with no files",
        cli("snapshot", "--device", "sim", "--out", "SCRATCH/pics", "--no-files", "ok.py"), 2,
        r"--out names files to write and --no-files writes none"),
    Row("snapshot demo with sanitize", cli("snapshot", "--demo", "--sanitize"), 2,
        r"--sanitize is for a script; --demo always runs its hand-off on the simulated runtime"),
    Row("snapshot demo with a device", cli("snapshot", "--demo", "--device", "sim"), 2, r"--device is for a script"),
    Row("snapshot demo with a policy", cli("snapshot", "--demo", "--policy", "stream_wait"), 2,
        r"--policy is for a script"),
    # snapshot: the script fails (the pictures are still written)
    Row("snapshot script raises", cli("snapshot", "--device", "sim", "raises.py"), 3,
        r"ValueError: boom\n(.|\n)*the script raised ValueError: boom; what it did until then is shown", ran=True),
    Row("snapshot script exits 3", cli("snapshot", "--device", "sim", "exit3.py"),
        3, r"the script exited with status 3", ran=True),
    Row("snapshot script exits with a message", cli("snapshot", "--device", "sim", "exitmsg.py"), 3,
        r"^the script says why\n(.|\n)*the script exited: the script says why", ran=True),
    Row("snapshot script interrupted", cli("snapshot", "--device", "sim", "interrupted.py"),
        3, r"the script raised KeyboardInterrupt",
        ran=True),
    Row("snapshot script with a syntax error", cli("snapshot", "--device", "sim", "syntax.py"), 3,
        r"SyntaxError: invalid syntax(.|\n)*the script raised SyntaxError", ran=False),
    Row("snapshot our option after the script",
        cli("snapshot", "--device", "sim", "--no-files", "ok.py", "--device", "cuda"), 0,
        r"note: --device after the script are passed to the script .* before the script", ran=True),
    # handoff
    Row("handoff --device cuda without CUDA", cli("handoff", "--device", "cuda"), 2,
        r"--device cuda needs a CUDA GPU and none is available; use --device sim", when=NO_CUDA),
    Row("handoff --device npu without torch_npu", cli("handoff", "--device", "npu"), 2,
        r"--device npu needs torch_npu and an Ascend NPU; torch_npu is not installed here .*use --device sim",
        when=NO_TORCH_NPU),
    Row("handoff unknown device", cli("handoff", "--device", "tpu"), 2, r"argument --device: invalid choice: 'tpu'"),
    Row("handoff layers 0", cli("handoff", "--layers", "0"), 2, r"argument --layers: must be at least 1, not 0"),
    Row("handoff layers 1", cli("handoff", "--layers", "1"), 2, r"argument --layers: must be at least 2, not 1"),
    Row("handoff width word", cli("handoff", "--width", "wide"), 2, r"argument --width: must be a whole number"),
    Row("handoff steps negative", cli("handoff", "--steps", "-2"), 2, r"argument --steps: must be at least 1"),
    Row("handoff width beyond memory", cli("handoff", "--width", "1000000"), 2,
        r"need about .* GiB of host memory on --device sim; this machine has .* use a smaller --width"),
    Row("handoff --fsdp2 yes without 2 GPUs", cli("handoff", "--fsdp2", "yes"), 2,
        r"--fsdp2 yes needs 2 CUDA GPUs \(found \d\)", when=FEWER_THAN_2_GPUS),
    Row("handoff --fsdp2 maybe", cli("handoff", "--fsdp2", "maybe"), 2, r"argument --fsdp2: invalid choice"),
    Row("handoff extra argument", cli("handoff", "extra"), 2, r"unrecognized arguments: extra"),
    # bench
    Row("bench unknown", cli("bench", "nope"), 2, r"no benchmark 'nope'(.|\n)*shim_alloc"),
    Row("bench model rounds 0", cli("bench", "model", "--rounds", "0"), 2, r"--rounds must be at least 1, not 0"),
    Row("bench model repeats negative", cli("bench", "model", "--repeats", "-1"), 2, r"--repeats must be at least 1"),
    Row("bench model rounds word", cli("bench", "model", "--rounds", "x"), 2, r"argument --rounds: invalid int"),
    Row("bench model unknown option", cli("bench", "model", "--bogus"), 2, r"unrecognized arguments: --bogus"),
    Row("bench record_use calls 0", cli("bench", "record_use", "--calls", "0"), 2, r"--calls must be at least 1"),
    Row("bench record_use --device cuda without CUDA", cli("bench", "record_use", "--device", "cuda"), 2,
        r"--device cuda needs a CUDA GPU and this machine has none; use --device sim", when=NO_CUDA),
    Row("bench handoff --device cuda without CUDA", cli("bench", "handoff", "--device", "cuda"), 2,
        r"--device cuda needs a CUDA GPU and this machine has none", when=NO_CUDA),
    Row("bench handoff width 0", cli("bench", "handoff", "--width", "0"), 2, r"--width must be at least 1"),
    Row("bench shim_alloc iters 0", cli("bench", "shim_alloc", "--iters", "0"), 2, r"--iters must be at least 1"),
    Row("bench sanitizer --device cuda without CUDA", cli("bench", "sanitizer", "--device", "cuda"), 2,
        r"--device cuda needs a CUDA GPU", when=NO_CUDA),
    Row("snapshot with a shim that does not load", cli_process("snapshot", "--demo", "--no-files",
                                                               env={"NPU_LIFETIME_SHIM": "/nonexistent/libnpl.so"}),
        2, r"cannot load the allocator shim NPU_LIFETIME_SHIM=/nonexistent/libnpl\.so: .* point it at a built"),
    Row("bench a benchmark that raises", lambda c: bench_script(c, "raise ZeroDivisionError('float division')"), 3,
        r"npu-lifetime bench fake: the benchmark raised ZeroDivisionError: float division \(exit 3\)"),
    Row("bench a benchmark that exits with a message", lambda c: bench_script(c, "raise SystemExit('no GPU')"), 3,
        r"^no GPU\n(.|\n)*the benchmark exited: no GPU"),
]

CHECK_ROWS = [
    Row("check missing script", cli("check", "--device", "sim", "SCRATCH/missing.py"), 2,
        r"no such script: .*missing\.py"),
    Row("check a directory", cli("check", "--device", "sim", "adir"), 2, r"adir is a directory"),
    Row("check --device cuda without CUDA", cli("check", "--device", "cuda", "ok.py"), 2,
        r"asked for 'cuda', but this machine has no CUDA device", when=NO_CUDA),
    Row("check --device npu without torch_npu", cli("check", "--device", "npu", "ok.py"), 2,
        r"asked for 'npu', but torch_npu is not installed", when=NO_TORCH_NPU),
    Row("check --shim on the simulated device", cli("check", "--device", "sim", "--shim", "ok.py"), 2,
        r"--shim installs the allocator shim for cuda or npu; the device here is 'sim'"),
    Row("check --json in a missing folder", cli("check", "--device", "sim", "--json", "SCRATCH/nowhere/f.json",
                                                 "ok.py"), 2, r"--json .*nowhere/f\.json: cannot write there"),
    Row("check unknown policy", cli("check", "--policy", "eventually", "ok.py"), 2,
        r"argument --policy: invalid choice: 'eventually'"),
    Row("check script raises", cli("check", "--device", "sim", "raises.py"), 3,
        r"ValueError: boom(.|\n)*the script raised ValueError: boom", ran=True),
    Row("check script exits 3", cli("check", "--device", "sim", "exit3.py"), 3,
        r"the script exited with status 3", ran=True),
    Row("check script exits with a message", cli("check", "--device", "sim", "exitmsg.py"), 3,
        r"the script says why(.|\n)*the script exited: the script says why", ran=True),
    # a script that ends with os._exit: what was found before it is reported, the process still ends there
    Row("check script ends with os._exit(0) after findings", cli_process("check", "--device", "sim", "osexit_race.py",
                                                                         env={}), 1,
        r"^npu_lifetime: 2 finding\(s\): 2 fail the check(.|\n)*\[uncovered free, latent\] `x`", ran=True),
    Row("check script ends with os._exit(0)", cli_process("check", "--device", "sim", "osexit0.py", env={}), 0,
        r"^npu-lifetime check: the script called os\._exit\(0\): the report above covers what it did until then$",
        ran=True),
    Row("check script ends with os._exit(5)", cli_process("check", "--device", "sim", "osexit5.py", env={}), 3,
        r"^npu-lifetime check: the script exited with status 5 \(os\._exit\)$", ran=True),
    Row("check our option after the script", cli("check", "--device", "sim", "ok.py", "--strict"), 0,
        r"^npu-lifetime check: note: --strict after the script are passed to the script \(its sys\.argv\); put "
        r"npu-lifetime's own options before the script$", ran=True),
    Row("check our options after the script, one with a value",
        cli("check", "--device", "sim", "ok.py", "--json=f.json", "--allow-latent", "-v"), 0,
        r"note: --json, --allow-latent after the script are passed to the script", ran=True),
    Row("fuzz no schedules", cli("fuzz", "-n", "0"), 2, r"--schedules must be at least 1"),
    Row("fuzz no jobs", cli("fuzz", "-n", "5", "-j", "0"), 2, r"--jobs must be at least 1"),
    Row("fuzz max events negative", cli("fuzz", "-n", "5", "--max-events", "-1"), 2,
        r"^npu-lifetime: --max-events must be at least 0, not -1$"),
    Row("fuzz max events negative, one job", cli("fuzz", "-n", "5", "-j", "1", "--max-events", "-1"), 2,
        r"--max-events must be at least 0"),
]

ROWS = (SHIM_ROWS + RECORDING_ROWS + MEMORY_ROWS + INSTALL_ROWS + FSDP2_ROWS + HARNESS_ROWS + RECORDER_ROWS + FUZZ_ROWS
        + SIMDEVICE_ROWS + SANITIZER_ROWS + CLI_ROWS
        + CHECK_ROWS)


# -- the state a failed call must leave alone -----------------------------------------------------------------
_COUNTS_OF_REPORTS = ("findings", "findings_dropped")  # a finding row adds one: checked by kind instead


def api_state() -> dict:
    from npu_lifetime.shim import hooks, torch_api

    stats = {k: v for k, v in shim.stats(0).items() if k not in _COUNTS_OF_REPORTS}
    return {
        "runtime": shim.runtime_name(), "policy": shim.policy(), "debug": shim.debug(),
        "fraction": shim.memory_fraction(0), "stats": stats, "blocks": shim.snapshot()["segments"],
        "installed": install_module.installed(),
        "torch routes": {name: getattr(torch._C, "_cuda_" + name, None) for name in torch_api._ROUTES},
        "record_use routes": (rec._fast, dict(rec._routes)),
        "Tensor.record_use": getattr(torch.Tensor, "record_use", None),
        "fsdp2 patched": fsdp2._active,
        "shim hook subscribers": hooks.subscribers(),
    }


def files_in(path) -> set:
    return {p.relative_to(path) for p in path.rglob("*")}


@pytest.fixture
def ctx(tmp_path, monkeypatch, request):
    shim.reset()
    shim.select_runtime("sim")
    shim.set_policy("poll")
    shim.set_debug(False)
    shim.sim.set_memory_limit(0)
    context = Ctx(tmp_path, monkeypatch, request)
    assert shim.findings() == []
    with context.exits:
        yield context
    shim.findings()
    shim.reset()
    shim.set_policy("poll")


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_bad_input(row: Row, ctx: Ctx, capsys) -> None:
    if not row.when:
        pytest.skip("this machine has what the row needs to be missing")
    if isinstance(row.gives, int):
        _cli_row(row, ctx, capsys)
    else:
        _api_row(row, ctx)


def _api_row(row: Row, ctx: Ctx) -> None:
    if row.setup is not None:
        row.setup(ctx)
    before = api_state()
    if isinstance(row.gives, str):  # the shim reports it; the call itself returns normally
        kind = row.gives.split(":", 1)[1]
        row.call(ctx)
        found = shim.findings()
        assert [f["kind"] for f in found] == [kind], found
        assert re.search(row.match, found[0].get("detail", "")), found[0]
    else:
        with pytest.raises(row.gives) as caught:
            row.call(ctx)
        assert re.search(row.match, str(caught.value)), f"message: {caught.value}"
        reported = [f["kind"] for f in shim.findings()]
        assert reported == ([row.finding] if row.finding else []), f"the shim reported {reported}"
    assert api_state() == before


def _cli_row(row: Row, ctx: Ctx, capsys) -> None:
    files_before = files_in(ctx.tmp)
    code = row.call(ctx)
    out, err = capsys.readouterr()
    assert code == row.gives, f"exit {code}, expected {row.gives}\nstderr: {err}\nstdout: {out[-2000:]}"
    message = err if re.search(row.match, err, re.MULTILINE) else out
    assert re.search(row.match, message, re.MULTILINE), f"stderr: {err}\nstdout: {out[-2000:]}"
    if code == 0:  # the message is a note on stderr
        assert re.search(row.match, err)
    ran = ctx.marker.exists()
    if row.ran is not None:
        assert ran == row.ran
    if code == 2:
        assert not ran, "bad input, yet the script ran"
        made_by_the_row = {p.relative_to(ctx.tmp) for p in ctx.tmp.glob("*.py")} | {Path("adir")}
        new = files_in(ctx.tmp) - files_before - made_by_the_row
        assert not new, f"bad input, yet it wrote {new}"
    if code == 3 and getattr(row.call, "argv", ("",))[0] == "snapshot":
        script = os.path.splitext(_scratch_arg(ctx, row.call.argv[-1]))[0]
        assert os.path.exists(script + ".snapshot.pickle") and os.path.exists(script + ".snapshot.html")


def test_the_table_is_large_and_every_row_names_what_was_wrong():
    assert len(ROWS) >= 200 and len({r.id for r in ROWS}) == len(ROWS)
    assert all(r.match or isinstance(r.gives, str) for r in ROWS)


@pytest.mark.parametrize("command", [[], ["snapshot"], ["handoff"], ["bench"]])
def test_help_states_the_exit_codes(command, capsys):
    assert main([*command, "--help"]) == 0
    out = capsys.readouterr().out
    assert "exit codes (every command):" in out
    assert re.search(r"2 +bad input: .* a device this machine lacks", out)
    assert re.search(r"3 +the script \(check, snapshot\) or the benchmark \(bench\) failed", out)


@pytest.mark.parametrize("command", ["check", "snapshot"])
def test_help_says_what_follows_the_script_is_the_scripts(command, capsys):
    assert main([command, "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "Options go before SCRIPT; what follows SCRIPT is the script's own arguments" in out


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"npu-lifetime {npu_lifetime.__version__}"


@pytest.mark.parametrize("call", [npu_lifetime.record_use, npu_lifetime.record_stream, npu_lifetime.erase_stream])
def test_a_tensor_without_elements_needs_nothing(call):
    # no memory to keep: not a freed storage (record_use called it one before)
    call(torch.empty(0), sd.Stream())
    call(torch.empty(0, 3), sd.Stream())
