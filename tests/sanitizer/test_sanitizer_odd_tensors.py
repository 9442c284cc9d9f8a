"""Odd tensors never turn a working program into a crash, and are tracked
through the tensors that hold their memory (issue 36, items 3 and 6; the
mapping is npu_lifetime/storage_holders.py): torch.func transforms, sparse
COO/CSR/CSC/BSR/BSC, nested, meta.  Each race below was unreported (sparse)
or crashed the program (torch.func, record_use on a nested tensor) before."""
import gc

import pytest
import torch

import npu_lifetime
from npu_lifetime import simdevice as sd
from npu_lifetime import storage_holders
from helpers.collecting import distinct_kinds, sanitizer

pytestmark = pytest.mark.usefixtures("both_ways")  # conftest.py: C parts, then Python's



def failing(san):
    """The kinds of the findings that fail the check (a storage still alive at the end does not)."""
    return distinct_kinds(san.failing(san.flush()))


@pytest.mark.parametrize("transform", [
    lambda f, x: torch.func.grad(lambda t: f(t).sum())(x),
    lambda f, x: torch.func.vmap(torch.func.grad(lambda t: f(t).sum()))(x.expand(3, -1).clone()),
    lambda f, x: torch.func.jacrev(f)(x),
    lambda f, x: torch.func.jvp(f, (x,), (torch.ones_like(x),)),
    lambda f, x: torch.func.vmap(f)(x.expand(2, -1).clone()),
], ids=["grad", "vmap_grad", "jacrev", "jvp", "vmap"])
def test_torch_func_transforms_run_under_the_sanitizer(transform):
    with sanitizer() as san:
        x = torch.randn(5)
        out = transform(lambda t: (t * t).sin(), x)
        assert out is not None
    assert distinct_kinds(san.flush()) == []


def test_a_race_inside_a_transform_is_found_on_the_wrapped_storage():
    with sanitizer() as san:
        side = sd.Stream()
        w = torch.randn(5)  # written on the default stream

        def f(t):
            with sd.stream(side):  # read on side, no wait: a race on w's storage
                return (t * w).sum()

        torch.func.grad(f)(torch.randn(5))
    assert "data_race" in distinct_kinds(san.flush())


SPARSE = {
    "coo": lambda d: d.to_sparse(),
    "csr": lambda d: d.to_sparse_csr(),
    "csc": lambda d: d.to_sparse_csc(),
    "bsr": lambda d: d.to_sparse_bsr((2, 2)),
    "bsc": lambda d: d.to_sparse_bsc((2, 2)),
}


@pytest.mark.parametrize("layout", sorted(SPARSE))
def test_a_race_on_a_sparse_tensor_is_found(layout):
    with sanitizer() as san:
        side = sd.Stream()
        s = SPARSE[layout](torch.randn(4, 4))  # made (written) on the default stream
        with sd.stream(side):
            s.values().mul(2) if layout != "coo" else s._values().mul(2)  # read on side with no wait
    assert "data_race" in distinct_kinds(san.flush())


@pytest.mark.parametrize("layout", sorted(SPARSE))
def test_a_sparse_op_reads_every_storage_holding_it(layout):
    with sanitizer() as san:
        side = sd.Stream()
        s = SPARSE[layout](torch.randn(4, 4))
        with sd.stream(side):
            s.to_dense()  # the sparse tensor itself as the op's argument
    found = [f for f in san.flush() if f.kind == "data_race"]
    assert sum(san.count(f) for f in found) == (2 if layout == "coo" else 3)  # each storage holding it is read


def test_a_sparse_hand_off_with_a_wait_is_clean():
    with sanitizer() as san:
        side = sd.Stream()
        s = torch.randn(4, 4).to_sparse()
        side.wait_stream(sd.default_stream())
        with sd.stream(side):
            d = s.to_dense()
        npu_lifetime.record_use(s, side)
        del s
        gc.collect()
        sd.default_stream().wait_stream(side)
        d.add_(1)
    assert failing(san) == []


@pytest.mark.parametrize("record", [True, False], ids=["record_use", "none"])
def test_record_use_on_a_nested_tensor_works_under_the_sanitizer_and_covers_its_free(record):
    """record_use on a nested tensor raised NotImplementedError (NestedTensorCPU)
    under the sanitizer; without it the same hand-off's free is uncovered
    (the check is real)."""
    with sanitizer() as san:
        side = sd.Stream()
        nt = torch.nested.nested_tensor([torch.randn(2), torch.randn(3)])
        side.wait_stream(sd.default_stream())
        with sd.stream(side):
            y = nt * 2
        if record:
            npu_lifetime.record_use(nt, side)
        del nt
        gc.collect()
        del y
        gc.collect()
    assert failing(san) == ([] if record else ["uncovered_free"])


def test_meta_tensors_pass_through():
    with sanitizer() as san:
        m = torch.empty(4, device="meta")
        (m + 1).sum()
    assert san.flush() == []
    assert san.not_checked() == {}


def test_storage_holders_of_each_kind():
    d = torch.randn(4, 4)
    for layout, make in SPARSE.items():
        held = storage_holders.holders(make(d))
        assert len(held) == (2 if layout == "coo" else 3), layout
        assert all(storage_holders.has_storage(t) for t in held)
    nt = torch.nested.nested_tensor([torch.randn(2), torch.randn(3)])
    (buffer,) = storage_holders.holders(nt)
    assert buffer.untyped_storage().data_ptr() == nt.untyped_storage().data_ptr()
    assert storage_holders.holders(d) == (d,) or storage_holders.holders(d)[0] is d
    assert storage_holders.holders(torch.empty(2, device="meta"))[0].is_meta


class NoMemoryShown(torch.Tensor):
    """A wrapper subclass that does not flatten: its storage shows no memory."""

    @staticmethod
    def __new__(cls, size):
        return torch.Tensor._make_wrapper_subclass(cls, size, dtype=torch.float32)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return torch.zeros(3)


def test_a_kind_with_no_memory_shown_is_listed_as_not_checked():
    with sanitizer() as san:
        t = NoMemoryShown((3,))
        t + 1
    assert san.flush() == []
    (kind,) = san.not_checked()
    assert "NoMemoryShown" in kind
    assert "not checked" in san.report([]) and "NoMemoryShown" in san.report([])


def test_an_ordinary_program_lists_nothing_as_not_checked():
    with sanitizer() as san:
        x = torch.ones(3)
        (x + 1).sum()
        torch.empty(0) + 1
    assert san.not_checked() == {}
    assert "not checked" not in san.report([])
