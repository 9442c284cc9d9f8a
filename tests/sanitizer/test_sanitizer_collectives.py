"""c10d collectives as accesses, on CPU with gloo and the simulated device:
the collective writes its outputs on its process group's own stream, after
the current stream; ``work.wait()`` (and ``async_op=False``) orders it for
the user.  The write/read table is checked against what gloo really changes
on two ranks."""
import gc
import os

import pytest
import torch
import torch.distributed as dist

from npu_lifetime import simdevice as sd
from npu_lifetime.lifetime import DataRace
from npu_lifetime.sanitizer import LifetimeSanitizer
from npu_lifetime.sanitizer.accesses import op_accesses
from helpers.stream_devices import used_on_side

pytestmark = [pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo"),
              pytest.mark.usefixtures("both_ways")]  # conftest.py: C parts, then Python's


@pytest.fixture
def world():
    """A single-process gloo world (collectives still run on gloo's threads)."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def races(run):
    san = LifetimeSanitizer("sim", on_race="collect", warn_on_free=False)
    with san:
        run()
        gc.collect()
    return [f for f in san.flush() if isinstance(f, DataRace)]


def test_using_an_all_reduce_output_before_wait_races(world):
    def run():
        x = torch.ones(16)
        work = dist.all_reduce(x, async_op=True)
        x.add_(1)  # the collective may still be writing x
        work.wait()

    [race] = races(run)
    assert race.access.op == "aten::add_" and race.prior.op == "c10d::allreduce_"
    assert race.prior.stream[1] < 0  # the process group's own stream


def test_using_it_after_wait_or_a_synchronous_call_does_not(world):
    def run():
        x = torch.ones(16)
        work = dist.all_reduce(x, async_op=True)
        work.wait()
        x.add_(1)
        dist.all_reduce(x)  # async_op=False: waited for inside
        x.mul_(2)

    assert races(run) == []


def test_all_to_all_single_writes_its_output(world):
    def run():
        x, y = torch.ones(16), torch.zeros(16)
        work = dist.all_to_all_single(y, x, async_op=True)
        y.add_(1)  # races with the collective's write of y
        x.add_(1)  # races with its read of x
        work.wait()

    found = sorted((r.access.op, r.race) for r in races(run))
    assert found == [("aten::add_", "write-after-read"), ("aten::add_", "write-after-write")]


def test_the_collective_starts_after_the_current_stream(world):
    def run():
        x, side = used_on_side(16, use=lambda x: x.mul_(3))
        sd.default_stream().wait_stream(side)
        dist.all_reduce(x)  # launched from the default stream, which waited for side
        side.wait_stream(sd.default_stream())
        with sd.stream(side):
            x.mul_(3)

    assert races(run) == []


# -- the write/read table against gloo on two ranks -----------------------------

def _collectives(rank: int, world: int) -> dict:
    """name -> (call, tensors it touches); outputs start at -1, inputs at
    rank-dependent values, so every output a collective writes changes."""
    def t(*shape, value=None):
        base = torch.full(shape, -1.0) if value is None else torch.full(shape, float(value))
        return base

    inp = lambda: t(4, value=rank + 2)  # noqa: E731
    out = lambda: t(4)  # noqa: E731
    cases = {}
    x = inp()
    cases["all_reduce"] = (lambda: dist.all_reduce(x), [x])
    b = inp()
    cases["broadcast"] = (lambda: dist.broadcast(b, src=0), [b])
    r = inp()
    cases["reduce"] = (lambda: dist.reduce(r, dst=0), [r])
    gi, go = inp(), [out() for _ in range(world)]
    cases["all_gather"] = (lambda: dist.all_gather(go, gi), [gi, *go])
    ti, to = inp(), t(4 * world)
    cases["all_gather_into_tensor"] = (lambda: dist.all_gather_into_tensor(to, ti), [ti, to])
    si, so = t(4 * world, value=rank + 2), out()
    cases["reduce_scatter_tensor"] = (lambda: dist.reduce_scatter_tensor(so, si), [si, so])
    ai, ao = t(4 * world, value=rank + 2), t(4 * world)
    cases["all_to_all_single"] = (lambda: dist.all_to_all_single(ao, ai), [ai, ao])
    li, lo = [inp() for _ in range(world)], [out() for _ in range(world)]
    cases["all_to_all"] = (lambda: dist.all_to_all(lo, li), [*li, *lo])
    hi, ho = inp(), [out() for _ in range(world)] if rank == 0 else None
    cases["gather"] = (lambda: dist.gather(hi, ho, dst=0), [hi, *(ho or [])])
    ci, co = ([inp() for _ in range(world)] if rank == 0 else None), out()
    cases["scatter"] = (lambda: dist.scatter(co, ci, src=0), [co, *(ci or [])])
    p = inp() if rank == 0 else out()
    cases["send_recv"] = ((lambda: dist.send(p, dst=1)) if rank == 0 else (lambda: dist.recv(p, src=0)), [p])
    return cases


def _rank_main(rank: int, world: int, port: int, results) -> None:
    from torch.utils._python_dispatch import TorchDispatchMode

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    seen: list = []

    class Classify(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func._schema.name.startswith("c10d::"):
                seen.append(op_accesses(func, args, kwargs or {}, out, lambda t: True))
            return out

    report = {}
    for name, (call, tensors) in _collectives(rank, world).items():
        before = [t.clone() for t in tensors]
        seen.clear()
        try:
            with Classify():
                call()
        except RuntimeError as err:  # a collective this gloo build lacks
            report[name] = ("unsupported", str(err)[:80])
            continue
        written = {a.storage for found in seen for a in found if a.is_write}
        read = {a.storage for found in seen for a in found if not a.is_write}
        changed = {t.untyped_storage().data_ptr() for t, old in zip(tensors, before) if not torch.equal(t, old)}
        report[name] = ("ok", sorted(changed - written), sorted(read & changed))
    report["sanitized"] = _sanitized_collectives(world)
    results[rank] = report
    dist.destroy_process_group()


def _sanitized_collectives(world: int) -> list:
    """Synchronous collectives under the sanitizer (gloo finishes some of
    them inside ``wait()``, with copies on the calling thread): no finding."""
    san = LifetimeSanitizer("sim", on_race="collect", warn_on_free=False)
    with san:
        inp = torch.ones(4 * world)
        out = torch.empty(4)
        dist.reduce_scatter_tensor(out, inp)
        out.add_(1)
        gathered = torch.empty(4 * world)
        dist.all_gather_into_tensor(gathered, out)
        gathered.mul_(2)
        del inp
        gc.collect()
    return [f.kind for f in san.flush() if not getattr(f, "live", False)]


def test_written_arguments_are_what_gloo_changes():
    """Every tensor a collective changed is classified as written, and no
    tensor classified as read-only changed (two ranks, gloo)."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    manager = mp.Manager()
    results = manager.dict()
    mp.spawn(_rank_main, args=(2, port, results), nprocs=2, join=True)
    checked = 0
    for rank, report in results.items():
        assert report.pop("sanitized") == [], f"rank {rank}: findings on correct synchronous collectives"
        for name, outcome in report.items():
            if outcome[0] == "ok":
                _, changed_not_written, read_but_changed = outcome
                assert changed_not_written == [], f"rank {rank}: {name} changed a tensor not classified as written"
                assert read_but_changed == [], f"rank {rank}: {name} changed a tensor classified as read"
                checked += 1
    assert checked >= 16, dict(results)  # most collectives ran on both ranks
