"""Each fault listed in issue 8 ("Where it stands"), reproduced on the
simulated device: every test here failed on the front end before the fix
(see the commit that added it)."""
import gc
import textwrap
import tracemalloc
import warnings

import pytest
import torch

import npu_lifetime
from npu_lifetime import simdevice as sd
from npu_lifetime.lifetime import DataRace, UncoveredFree
from npu_lifetime.sanitizer import LifetimeSanitizer
from helpers.stream_devices import used_on_side
from helpers.collecting import kinds, sanitizer
from helpers.scripts import run_user_tests

pytestmark = pytest.mark.usefixtures("both_ways")  # conftest.py: C parts, then Python's



# -- a custom op that reads its input, then synchronises the host with the
# current stream, as CUDA's .item() / nonzero() / blocking copies do inside
# their kernels (below any dispatch mode)
_lib = torch.library.Library("npl_fault_test", "DEF")
_lib.define("read_then_sync(Tensor x) -> float")


def _read_then_sync(x):
    value = float(x.sum())
    sd.current_stream().synchronize()
    return value


_lib.impl("read_then_sync", _read_then_sync, "CPU")


def test_a_host_sync_inside_an_op_comes_after_the_ops_own_reads():
    san = sanitizer()
    with san:
        x, _side = used_on_side(8, use=torch.ops.npl_fault_test.read_then_sync)  # then the host waits for side
        x.add_(1)  # ordered after the read: the host synchronised with side after it
        del x
        gc.collect()
    assert san.flush() == []


@pytest.mark.parametrize("readback", [
    lambda t: t[0].item(), lambda t: float(t[0]), lambda t: bool(t[0]), lambda t: t.nonzero(),
])
def test_reading_a_value_back_synchronises_like_cuda(readback):
    san = sanitizer()
    with san:
        x, _side = used_on_side(8, use=readback)  # on CUDA: a read on side, then a host sync with side
        x.add_(1)
        del x
        gc.collect()
    assert san.flush() == []


CORRECT_RECORD_USE_SCRIPT = """
import torch
import npu_lifetime
from npu_lifetime import simdevice as sd

side = sd.Stream()
x = torch.ones(32)
side.wait_stream(sd.default_stream())
with sd.stream(side):
    y = x * 2
    total = y.sum().item()  # on CUDA the host waits for side here
npu_lifetime.record_use(x, side)
del x
print("result", total, float(y[0]))  # so reading y on the default stream is ordered
"""


def test_check_of_a_correct_record_use_script_that_prints_a_result(tmp_path, capsys):
    from npu_lifetime.cli import main

    path = tmp_path / "prog.py"
    path.write_text(CORRECT_RECORD_USE_SCRIPT)
    assert main(["check", "--device", "sim", str(path)]) == 0, capsys.readouterr().out


def correct_handoff():
    x, side = used_on_side(16)
    npu_lifetime.record_use(x, side)
    del x
    gc.collect()


def test_an_outer_sanitizer_keeps_seeing_events_after_an_inner_one_is_disabled():
    outer = sanitizer().enable()
    try:
        with sanitizer():
            pass
        correct_handoff()
    finally:
        outer.disable()
    assert outer.flush() == []


def test_both_sanitizers_see_everything_while_both_are_enabled():
    outer = sanitizer().enable()
    try:
        inner = sanitizer().enable()
        x, side = used_on_side(16)
        npu_lifetime.record_use(x, side)
        with sd.stream(side):
            x.sum()  # after the record_use: not covered
        del x
        gc.collect()
        inner.disable()
    finally:
        outer.disable()
    assert kinds(outer.flush()) == kinds(inner.flush()) == ["uncovered_free"]


def test_check_of_a_script_with_its_own_sanitizer_block(tmp_path, capsys):
    from npu_lifetime.cli import main

    path = tmp_path / "prog.py"
    path.write_text(textwrap.dedent("""
        import gc, torch, npu_lifetime
        from npu_lifetime import simdevice as sd
        from npu_lifetime.sanitizer import LifetimeSanitizer

        with LifetimeSanitizer("sim", on_race="collect", warn_on_free=False) as san:
            side = sd.Stream()
            x = torch.ones(16)
        side.wait_stream(sd.default_stream())
        with sd.stream(side):
            x.sum()
        npu_lifetime.record_use(x, side)
        x.sum()  # on its allocation stream: needs nothing
        del x
        gc.collect()
    """))
    assert main(["check", "--device", "sim", str(path)]) == 0, capsys.readouterr().out


def test_marker_tests_under_the_process_sanitizer(tmp_path):
    done = run_user_tests(tmp_path, """
        import gc, pytest, torch, npu_lifetime
        from npu_lifetime import simdevice as sd

        def handoff():
            side = sd.Stream()
            x = torch.ones(32)
            side.wait_stream(sd.default_stream())
            with sd.stream(side):
                x.sum()
            npu_lifetime.record_use(x, side)
            x.sum()  # on its allocation stream: needs nothing
            del x
            gc.collect()

        @pytest.mark.lifetime_sanitizer(device="sim")
        def test_one():
            handoff()

        @pytest.mark.lifetime_sanitizer(device="sim")
        def test_two():
            handoff()

        @pytest.mark.lifetime_sanitizer(device="sim")
        def test_three():
            handoff()
    """, env={"NPU_LIFETIME_SANITIZER": "sim"})
    assert "3 passed" in done.stdout, done.stdout + done.stderr


def test_a_storage_from_before_enable_keeps_its_allocation_stream():
    x = torch.ones(16)  # allocated on the default stream, before the sanitizer
    san = sanitizer()
    with san:
        side = sd.Stream()
        side.wait_stream(sd.default_stream())
        with sd.stream(side):
            x.sum()  # first seen here, on side
        del x  # a missing hand-off: the use on side is not covered
        gc.collect()
    assert kinds(san.flush()) == ["uncovered_free"]


def test_a_correct_hand_off_of_a_storage_from_before_enable_is_clean():
    x = torch.ones(16)
    san = sanitizer()
    with san:
        side = sd.Stream()
        side.wait_stream(sd.default_stream())
        with sd.stream(side):
            x.sum()
        npu_lifetime.record_use(x, side)
        x.sum()  # a use on its own allocation stream needs nothing
        del x
        gc.collect()
    assert san.flush() == []


def test_torch_empty_is_an_allocation_on_the_current_stream():
    san = sanitizer()
    with san:
        side = sd.Stream()
        x = torch.empty(16)  # the allocation
        side.wait_stream(sd.default_stream())
        with sd.stream(side):
            x.fill_(1.0)  # first written on side
        del x
        gc.collect()
    [f] = san.flush()
    assert isinstance(f, UncoveredFree)
    assert "x = torch.empty(16)" in open(__file__).read().splitlines()[f.alloc_site.user_frames()[0][1] - 1]


@pytest.mark.parametrize("metadata_op", [
    lambda t: t.unsqueeze_(0), lambda t: t.t_(), lambda t: t.squeeze_(),
    lambda t: t.as_strided_((16,), (1,)), lambda t: t.transpose_(0, 1),
])
def test_in_place_metadata_ops_write_no_data(metadata_op):
    san = sanitizer()
    with san:
        x, side = used_on_side((4, 4))
        metadata_op(x)  # no data touched: no race with the read on side
        npu_lifetime.record_use(x, side)
        del x
        gc.collect()
    assert san.flush() == []


def test_warnings_as_errors_lose_no_finding_of_a_free():
    san = LifetimeSanitizer("sim", on_race="collect", warn_on_free=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with san:
            s1, s2 = sd.Stream(), sd.Stream()
            x = torch.ones(16)
            for s in (s1, s2):
                s.wait_stream(sd.default_stream())
                with sd.stream(s):
                    x.sum()
            del x  # uncovered for both side streams
            gc.collect()
    found = san.flush()
    assert sorted(f.usage_stream for f in found) == sorted([s1.key, s2.key])


def clean_step(a, side):
    side.wait_stream(sd.default_stream())
    with sd.stream(side):
        b = a * 2
        c = b + 1
    sd.default_stream().wait_stream(side)
    out = c.relu()
    side.wait_stream(sd.default_stream())  # c (side's) was last used on the default stream
    return out


def test_a_clean_loop_retains_no_memory_per_op():
    san = sanitizer()
    with san:
        side = sd.Stream()
        a = torch.ones(64)
        for _ in range(2000):  # warm up: caches, interned sites
            a = clean_step(a, side)
        tracemalloc.start()
        before = tracemalloc.take_snapshot()
        for _ in range(6000):  # 18k ops, 12k frees
            a = clean_step(a, side)
        gc.collect()
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
    grown = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    assert grown < 256 * 1024, f"{grown / 1024:.0f} KiB retained by a clean loop"
    assert san.flush() == []


def test_a_race_in_a_loop_is_one_finding_with_a_count():
    san = sanitizer()
    with san:
        side = sd.Stream()
        for _ in range(50):
            x = torch.ones(8)
            with sd.stream(side):
                x.sum()  # races with the allocation on the default stream
            npu_lifetime.record_use(x, side)
            del x
        gc.collect()
    [f] = san.flush()
    assert isinstance(f, DataRace) and san.count(f) == 50


def test_an_uncovered_free_in_a_loop_warns_once():
    san = LifetimeSanitizer("sim", on_race="collect", warn_on_free=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # every warning issued is recorded: nothing hides repeats
        with san:
            side = sd.Stream()
            for _ in range(50):
                x = torch.ones(8)
                side.wait_stream(sd.default_stream())
                with sd.stream(side):
                    x.sum()
                del x  # uncovered, at the same sites every time
            gc.collect()
    lifetime = [w for w in caught if "uncovered free" in str(w.message)]
    assert len(lifetime) == 1
    # (the CPU allocator may hand a freed x to the next x: those are reuse races, grouped too)
    frees = [f for f in san.flush() if f.kind == "uncovered_free"]
    assert [san.count(f) for f in frees] == [50]
