"""Wrong verdicts listed in issue 17 ("Where it stands"), each reproduced on
the simulated device: every test here failed before its fix (see the commit
that added it)."""
import gc
import threading

import pytest
import torch

import npu_lifetime
from npu_lifetime import simdevice as sd
from npu_lifetime.cli import main
from helpers.scripts import write_script
from helpers.stream_devices import used_on_side
from helpers.collecting import kinds, sanitizer

pytestmark = pytest.mark.usefixtures("both_ways")  # conftest.py: C parts, then Python's



# -- waits on events never recorded -------------------------------------------------------------------------------
def test_waiting_on_an_event_never_recorded_is_a_no_op_not_a_finding():
    san = sanitizer()
    with san:
        side = sd.Stream()
        event = sd.Event()
        side.wait_event(event)  # completes at once on the device: orders nothing
        event.synchronize()     # likewise for the host
        x = torch.ones(8)
        side.wait_stream(sd.default_stream())
        with sd.stream(side):
            x.sum()
        npu_lifetime.record_use(x, side)
        del x
        gc.collect()
    assert san.flush() == []


def test_an_unrecorded_wait_orders_nothing():
    san = sanitizer()
    with san:
        side = sd.Stream()
        event = sd.Event()
        x = torch.ones(8)
        sd.default_stream().wait_event(event)  # a no-op: does not order side's later write
        with sd.stream(side):
            x.add_(1)  # races with the allocation on the default stream
        npu_lifetime.record_use(x, side)
        del x
        gc.collect()
    assert kinds(san.flush()) == ["data_race"]


def test_a_pipeline_whose_first_iteration_waits_on_an_unrecorded_event_passes_check(tmp_path, capsys):
    """A pipeline whose first iteration waits on an event not recorded yet:
    the wait completes at once (CUDA) and CSAN reports nothing."""
    path = write_script(tmp_path, """
        import torch
        import npu_lifetime
        from npu_lifetime import simdevice as sd

        side = sd.Stream()
        done = sd.Event()
        buffers = []
        for step in range(3):
            side.wait_event(done)          # first iteration: never recorded yet, a no-op
            with sd.stream(side):
                b = torch.ones(64) * step  # produced on side
            done.record(side)
            sd.default_stream().wait_event(done)
            buffers.append(b.sum())        # consumed on main, after the wait
            npu_lifetime.record_use(b, sd.default_stream())  # its free waits for that use
        sd.synchronize()
    """)
    assert main(["check", "--device", "sim", path]) == 0, capsys.readouterr().out
    assert "no findings" in capsys.readouterr().out
# -- constructors that read only their input's metadata -------------------------------------------------------------
CONSTRUCTORS = {
    "zeros_like": torch.zeros_like, "ones_like": torch.ones_like, "full_like": lambda t: torch.full_like(t, 2.0),
    "randn_like": torch.randn_like, "rand_like": torch.rand_like, "randint_like": lambda t: torch.randint_like(t, 9),
    "empty_like": torch.empty_like, "new_zeros": lambda t: t.new_zeros(3), "new_ones": lambda t: t.new_ones(3),
    "new_full": lambda t: t.new_full((3,), 1.0), "new_empty": lambda t: t.new_empty(3),
}


@pytest.mark.parametrize("make", CONSTRUCTORS.values(), ids=CONSTRUCTORS.keys())
def test_like_and_new_constructors_do_not_read_their_input(make):
    san = sanitizer()
    with san:
        x, side = used_on_side(8, use=lambda x: x.mul_(2))  # written on side
        npu_lifetime.record_use(x, side)
        y = make(x)  # on the default stream: x's shape and dtype only, no race with side's write
        with sd.stream(side):
            z = make(x)  # on side: reads nothing of x, so x's free needs no hand-off for it
        del x, y, z
        gc.collect()
    assert san.flush() == []


# -- _unsafe_view is a view ----------------------------------------------------------------------------------------
def test_unsafe_view_writes_nothing():
    san = sanitizer()
    with san:
        x, side = used_on_side((4, 4))  # read on side
        v = torch.ops.aten._unsafe_view(x, [16])  # on the default stream: a view, no write racing with the read
        npu_lifetime.record_use(x, side)
        del x, v
        gc.collect()
    assert san.flush() == []


# -- tensors made from host data inside a side-stream context --------------------------------------------------------
HOST_DATA = {
    "tensor": lambda: torch.tensor([1.0, 2.0, 3.0]),
    "as_tensor": lambda: torch.as_tensor([1.0, 2.0, 3.0]),
    "asarray": lambda: torch.asarray([1.0, 2.0, 3.0]),
    "from_numpy": lambda: torch.from_numpy(pytest.importorskip("numpy").ones(3, dtype="float32")),
}


@pytest.mark.parametrize("make", HOST_DATA.values(), ids=HOST_DATA.keys())
def test_a_tensor_made_from_host_data_is_allocated_on_the_current_stream(make):
    san = sanitizer()
    with san:
        side = sd.Stream()
        with sd.stream(side):
            t = make()  # allocated (and copied to) on side, as on CUDA
            t.add_(1)  # used on its own allocation stream: needs nothing
        del t
        gc.collect()
    assert san.flush() == []


def test_a_tensor_made_on_a_side_stream_and_read_on_main_without_a_wait_races():
    san = sanitizer()
    with san:
        side = sd.Stream()
        with sd.stream(side):
            t = torch.tensor([1.0, 2.0, 3.0])  # the copy in runs on side
        t.sum()  # on the default stream, not ordered after it
        npu_lifetime.record_use(t, sd.default_stream())
        del t
        gc.collect()
    [race] = san.flush()
    assert race.kind == "data_race" and race.prior.stream == side.key


# -- resizing a storage: resize_ to a larger size copies the data; storage resize_(0) frees ------------------------
def test_resize_to_a_larger_size_reads_the_old_data():
    san = sanitizer()
    with san:
        x, side = used_on_side(8, use=lambda x: x.mul_(2))  # written on side
        npu_lifetime.record_use(x, side)
        x.resize_(4096)  # on the default stream: copies the old data into a new block, unordered with the write
        del x
        gc.collect()
    races = [f for f in san.flush() if f.kind == "data_race"]
    assert [(r.access.op, r.access.verb, r.prior.stream) for r in races] == [("aten::resize_", "read", side.key)]


def test_a_tensor_resized_larger_is_tracked_at_its_new_memory():
    san = sanitizer()
    with san:
        side = sd.Stream()
        x = torch.ones(8)
        before = x.untyped_storage().data_ptr()
        x.resize_(4096)  # a new block on the default stream; the old one is freed
        assert x.untyped_storage().data_ptr() != before
        side.wait_stream(sd.default_stream())
        with sd.stream(side):
            x.add_(1)  # the new storage, allocated on the default stream, used on side
        del x  # uncovered: the free of the new storage leaves the use on side
        gc.collect()
    [free] = san.flush()
    assert free.kind == "uncovered_free" and free.size == 4096 * 4 and free.last_use.op == "aten::add_"
    assert "x.resize_(4096)" in _line(free.alloc_site)
    assert len(san.storages) == 0


def _line(site):
    filename, line, _ = site.user_frames()[0]
    return open(filename).read().splitlines()[line - 1]


def test_storage_resize_to_zero_is_a_free():
    san = sanitizer()
    with san:
        x, side = used_on_side(1024, use=lambda x: x.sum())  # read on side
        x.untyped_storage().resize_(0)  # FSDP frees this way: the memory goes back now
        x.untyped_storage().resize_(1024 * 4)  # and comes back later, a new block on the current stream
        x.fill_(1.0)  # if the host hands the same memory back, this is a reuse race with the read on side
        del x
        gc.collect()
    found = san.flush()
    assert set(kinds(found)) <= {"uncovered_free", "reuse_race"}
    [free] = [f for f in found if f.kind == "uncovered_free"]
    assert free.last_use.op == "aten::sum"
    assert "resize_(0)" in _line(free.free_site)  # freed there, not when x died
    assert "npu_lifetime.record_use(" in free.fix() or "record_stream" in free.fix()
    assert len(san.storages) == 0


def test_storage_resize_to_zero_after_a_hand_off_is_clean():
    san = sanitizer()
    with san:
        x, side = used_on_side(1024)
        npu_lifetime.record_use(x, side)
        x.untyped_storage().resize_(0)
        x.untyped_storage().resize_(1024 * 4)
        with sd.stream(side):  # the new block is the default stream's: side waits before using it
            side.wait_stream(sd.default_stream())
            x.fill_(2.0)
        npu_lifetime.record_use(x, side)
        del x
        gc.collect()
    assert san.flush() == []


# -- reading data back to the host: .tolist(), .cpu(), .numpy() ----------------------------------------------------
def _numpy(t):
    pytest.importorskip("numpy")
    return t.numpy()


READ_BACKS = {"tolist": lambda t: t.tolist(), "cpu": lambda t: t.cpu(), "numpy": _numpy}


@pytest.mark.parametrize("read_back", READ_BACKS.values(), ids=READ_BACKS.keys())
def test_a_read_back_reads_and_synchronises_the_host_like_cuda(read_back):
    san = sanitizer()
    with san:
        side = sd.Stream()
        x = torch.ones(8)
        side.wait_stream(sd.default_stream())
        with sd.stream(side):
            y = x * 2
            read_back(y)  # on CUDA: a copy to the host on side, and the host waits for it
        z = y + 1  # on the default stream, queued after the host's wait: ordered after side's write
        npu_lifetime.record_use(y, sd.default_stream())
        del x, y, z  # x's use on side is behind the host's wait: covered
        gc.collect()
    assert san.flush() == []


@pytest.mark.parametrize("read_back", READ_BACKS.values(), ids=READ_BACKS.keys())
def test_a_read_back_of_data_written_on_another_stream_races(read_back):
    san = sanitizer()
    with san:
        x, side = used_on_side(8, use=lambda x: x.mul_(3))  # written on side
        npu_lifetime.record_use(x, side)
        read_back(x)  # copied back on the default stream, not ordered after the write
        del x
        gc.collect()
    [race] = san.flush()
    assert race.kind == "data_race" and race.prior.stream == side.key and not race.access.is_write


# -- host waits for a collective through its future or by polling ---------------------------------------------------
@pytest.fixture
def gloo_world():
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("needs gloo")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield dist
    dist.destroy_process_group()


def _wait_by_polling(work):
    import time

    while not work.is_completed():
        time.sleep(0.001)


HOST_WAITS = {
    "future.wait": lambda work: work.get_future().wait(),
    "futures.wait_all": lambda work: torch.futures.wait_all([work.get_future()]),
    "is_completed": _wait_by_polling,
    "future.done": lambda work: _poll_future(work.get_future()),
    "collect_all": lambda work: torch.futures.collect_all([work.get_future()]).wait(),
}


def _poll_future(future):
    import time

    while not future.done():
        time.sleep(0.001)


@pytest.mark.parametrize("wait", HOST_WAITS.values(), ids=HOST_WAITS.keys())
def test_a_host_wait_through_the_collectives_future_orders_it(gloo_world, wait):
    san = sanitizer()
    with san:
        x = torch.ones(16)
        work = gloo_world.all_reduce(x, async_op=True)
        wait(work)  # the host knows the collective is done
        x.add_(1)  # queued after that: ordered after the collective's write
        del x
        gc.collect()
    assert san.flush() == []


def test_without_a_wait_the_collectives_output_still_races(gloo_world):
    san = sanitizer()
    with san:
        x = torch.ones(16)
        work = gloo_world.all_reduce(x, async_op=True)
        future = work.get_future()
        x.add_(1)  # the collective may still be writing x
        future.wait()
        del x
        gc.collect()
    assert kinds(san.flush()) == ["data_race"]


# -- host threads each have their own clock --------------------------------------------------------------------------
def _used_on_side():
    x, side = used_on_side(8)
    return side, x


def test_a_host_wait_on_another_thread_does_not_cover_a_free():
    san = sanitizer()
    with san:
        side, x = _used_on_side()
        synced = threading.Event()

        def wait_for_side():
            side.synchronize()  # this thread waits for side...
            synced.set()

        worker = threading.Thread(target=wait_for_side)
        worker.start()
        synced.wait()  # (threads are ordered only by start and join: this hand-off is not seen)
        del x  # ...this one never did
        gc.collect()
        worker.join()
    assert kinds(san.flush()) == ["uncovered_free"]


def test_joining_a_thread_that_waited_covers_the_free():
    san = sanitizer()
    with san:
        side, x = _used_on_side()
        worker = threading.Thread(target=side.synchronize)
        worker.start()
        worker.join()  # ordered after everything the worker waited for
        del x
        gc.collect()
    assert san.flush() == []


def test_a_thread_started_after_a_wait_is_ordered_after_it():
    san = sanitizer()
    with san:
        side, x = _used_on_side()
        side.synchronize()
        box = [x]
        del x

        def free_it():
            box.clear()  # the last reference dies on this thread
            gc.collect()

        worker = threading.Thread(target=free_it)
        worker.start()
        worker.join()
    assert san.flush() == []


def test_a_free_on_another_thread_is_not_covered_by_this_threads_later_wait():
    san = sanitizer()
    with san:
        side, x = _used_on_side()
        box = [x]
        del x
        worker = threading.Thread(target=box.clear)  # frees x: that thread never waited for side
        worker.start()
        worker.join()
        side.synchronize()  # too late: the free happened before
        gc.collect()
    assert kinds(san.flush()) == ["uncovered_free"]


def test_the_model_keeps_a_clock_per_host_thread():
    from npu_lifetime.lifetime import LifetimeModel

    def run(join: bool):
        m = LifetimeModel(host="T1")
        for stream in "AU":
            m.create_stream(stream)
        m.allocate("x", "A")
        m.wait_stream("U", "A")
        m.read("x", "U")
        m.set_host("T2")
        m.synchronize_stream("U")  # T2 waits for the use
        m.set_host("T1")
        if join:
            m.join_host("T2")  # T1 joins T2: ordered after its wait
        return [f.kind for f in m.free("x")]

    assert run(join=False) == ["uncovered_free"]
    assert run(join=True) == []


# -- autograd's stream semantics: each backward op on its forward op's stream ---------------------------------------
def test_backward_ops_run_on_their_forward_ops_streams():
    """Race-free on CUDA: the forward runs on side, backward() is called on
    the default stream with no wait; autograd runs each backward op on its
    forward op's stream (after a wait for the caller's stream, where the
    initial gradient, ones_like(loss), is made: it reads nothing of loss), and
    the caller's stream waits for the backward's streams at the end."""
    san = sanitizer()
    with san:
        side = sd.Stream()
        w = torch.ones(8, requires_grad=True)
        side.wait_stream(sd.default_stream())
        with sd.stream(side):
            h = w * 2  # written on side
            loss = (h * h).sum()  # saves h for the backward
        loss.backward()  # MulBackward0 reads h: on side, as on CUDA
        total = w.grad.sum()  # on the default stream, ordered after the backward
        del h, loss, total
        gc.collect()
    assert [f for f in san.flush() if not f.live] == []


def test_backward_nodes_wait_for_the_streams_that_produced_their_gradients():
    san = sanitizer()
    with san:
        s1, s2 = sd.Stream(), sd.Stream()
        w = torch.ones(8, requires_grad=True)
        for s in (s1, s2):
            s.wait_stream(sd.default_stream())
        with sd.stream(s1):
            a = (w * 3).exp()  # forward on s1
        s2.wait_stream(s1)
        with sd.stream(s2):
            loss = (a * a).sum()  # forward on s2, saving a (s1's)
        loss.backward()  # a's gradient is made on s2, consumed by ExpBackward on s1 (which waits for s2)
        grad = w.grad.clone()
        del a, loss, grad
        gc.collect()
    assert [f for f in san.flush() if not f.live] == []


# -- an op whose output shape depends on the data writes its output after its host sync ---------------------------
@pytest.mark.parametrize("op", [lambda t: t.nonzero(), lambda t: t.masked_select(t > 0), lambda t: t.unique()],
                         ids=["nonzero", "masked_select", "unique"])
def test_a_data_dependent_output_is_written_after_the_ops_host_sync(op):
    """On CUDA, nonzero reads its input, synchronises the host to learn the
    output's size, then writes the output: a read of the output on another
    stream with no wait races with that write."""
    san = sanitizer()
    with san:
        s1, s2 = sd.Stream(), sd.Stream()
        x = torch.ones(8)
        s2.wait_stream(sd.default_stream())
        with sd.stream(s2):
            out = op(x)  # the output is written on s2, after the host sync
        npu_lifetime.record_use(x, s2)
        with sd.stream(s1):
            out.sum()  # no wait for s2
        npu_lifetime.record_use(out, s1)
        del x, out
        gc.collect()
    races = [f for f in san.flush() if f.kind == "data_race"]
    assert [(r.access.stream, r.prior.stream, r.prior.is_write) for r in races] == [(s1.key, s2.key, True)]
