"""Read-backs and moved storages on the simulated device (issue 36, item 4):
``.to("cpu")``, ``torch.save``, pickle and ``.numpy()`` copy a device tensor
to the host as ``.cpu()`` does (a read on the current stream, then a host
wait); ``share_memory_()`` moves a storage (its old block is freed); the
storage table never drops what the model found about a storage whose free
it learns late."""
import gc
import io
import pickle

import pytest
import torch

from npu_lifetime import simdevice as sd
from helpers.collecting import distinct_kinds, sanitizer
from helpers.stream_devices import used_on_side

pytestmark = pytest.mark.usefixtures("both_ways")  # conftest.py: C parts, then Python's



READ_BACKS = {
    "cpu": lambda t: t.cpu(),
    "to_cpu": lambda t: t.to("cpu"),
    "to_device_kw": lambda t: t.to(device="cpu"),
    "to_like": lambda t: t.to(torch.empty(0)),
    "numpy": lambda t: t.numpy(),
    "tolist": lambda t: t.tolist(),
    "pickle": lambda t: pickle.dumps(t),
    "torch_save": lambda t: torch.save(t, io.BytesIO()),
}


@pytest.mark.parametrize("read_back", sorted(READ_BACKS))
def test_a_read_back_on_a_side_stream_races_an_unwaited_write(read_back):
    with sanitizer() as san:
        side = sd.Stream()
        x = torch.ones(16)  # written on the default stream
        with sd.stream(side):
            READ_BACKS[read_back](x)  # read on side with no wait: a race, as .cpu() is
    assert "data_race" in distinct_kinds(san.flush())


@pytest.mark.parametrize("read_back", sorted(READ_BACKS))
def test_a_read_back_waits_for_the_stream_it_read_on(read_back):
    """The host waited for the read: a free after it is covered."""
    with sanitizer() as san:
        side = sd.Stream()
        x = torch.ones(16)
        side.wait_stream(sd.default_stream())
        with sd.stream(side):
            y = x * 2  # written on side, allocated there
        sd.default_stream().wait_stream(side)
        with sd.stream(side):
            READ_BACKS[read_back](y)  # read on side, then the host waits for side
        del y
        gc.collect()
    assert distinct_kinds(san.failing(san.flush())) == []


def test_to_a_dtype_is_no_read_back():
    with sanitizer() as san:
        x, side = used_on_side(16, use=lambda x: x.to(torch.float64))  # an op on side: no host wait
        gc.collect()  # its output was allocated on side and freed there: its own stream, nothing to cover
        z = torch.ones(4)
        with sd.stream(side):
            z.to(torch.float64)
        del z
        gc.collect()  # read on side, freed from default with no wait: uncovered (a read-back would have waited)
    assert "uncovered_free" in distinct_kinds(san.failing(san.flush()))


def test_share_memory_reports_the_old_storages_free():
    with sanitizer() as san:
        x, side = used_on_side(64, use=lambda x: x * 2)  # reads x on side
        before = x.untyped_storage().data_ptr()
        x.share_memory_()  # x's old block is freed here, its read on side not covered
        assert x.untyped_storage().data_ptr() != before
    found = san.failing(san.flush())
    assert "uncovered_free" in distinct_kinds(found)


def test_share_memory_after_a_covered_use_is_clean():
    with sanitizer() as san:
        x, side = used_on_side(64, use=lambda x: x * 2)
        sd.default_stream().wait_stream(side)
        x.share_memory_()
        x.add_(1)  # the new block, written on the default stream
    assert distinct_kinds(san.failing(san.flush())) == []


def test_an_allocation_over_a_storage_whose_free_was_not_seen_reports_that_storage():
    """The table learns of the free only when the address is allocated again:
    the old storage's uncovered use is reported, named as that storage (it
    was dropped before)."""
    with sanitizer() as san:
        side = sd.Stream()
        default = sd.default_stream()
        san.on_shim_alloc(0x1000, 256, default.key)
        sid = san.storages.get(0x1000)
        san.model.access(sid, san._stream(side.key), False, "aten::read", None, ("self",))
        san.on_shim_alloc(0x1000, 256, default.key)  # its free was never seen
        assert san.storages.get(0x1000) != sid
    found = [f for f in san.flush() if f.kind == "uncovered_free"]
    assert found and found[0].storage == sid
