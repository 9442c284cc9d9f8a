"""The sanitizer front end on CPU: access extraction from schemas, findings
with sites, reports, JSON, modes, flush, enabling and disabling."""
import gc
import json
import os
import subprocess
import sys
import warnings

import pytest
import torch

import npu_lifetime
from npu_lifetime import simdevice as sd
from npu_lifetime.lifetime import DataRace, UncoveredFree
from npu_lifetime.sanitizer import DataRaceError, LifetimeSanitizer, LifetimeWarning
from npu_lifetime.sanitizer.accesses import op_accesses, plan, written_storages
from helpers.stream_devices import used_on_side

pytestmark = pytest.mark.usefixtures("both_ways")  # conftest.py: C parts, then Python's

aten = torch.ops.aten


def accesses(func, args, kwargs=None, outputs=None):
    found = op_accesses(func, args, kwargs or {}, outputs, lambda t: True)
    return sorted((a.storage, a.is_write) for a in found)


def ptr(t):
    return t.untyped_storage().data_ptr()


def test_reads_and_fresh_outputs():
    a, b = torch.ones(4), torch.ones(4)
    out = a + b
    expected = sorted([(ptr(a), False), (ptr(b), False), (ptr(out), True)])
    assert accesses(aten.add.Tensor, (a, b), outputs=out) == expected


def test_in_place_and_out_arguments_are_writes():
    a, b = torch.ones(4), torch.ones(4)
    assert accesses(aten.add_.Tensor, (a, b), outputs=a) == sorted([(ptr(a), True), (ptr(b), False)])
    out = torch.empty(4)
    assert (ptr(out), True) in accesses(aten.add.out, (a, b), {"out": out}, outputs=out)


def test_views_touch_no_data_and_aliases_are_not_recounted():
    a = torch.ones(4, 4)
    assert accesses(aten.view.default, (a, [16]), outputs=a.view(16)) == []
    parts = a.split(2)
    assert accesses(aten.split.Tensor, (a, 2), outputs=parts) == []


def test_tensor_lists_and_multiple_outputs():
    a, b = torch.ones(2), torch.ones(3)
    out = torch.cat([a, b])
    expected = sorted([(ptr(a), False), (ptr(b), False), (ptr(out), True)])
    assert accesses(aten.cat.default, ([a, b],), outputs=out) == expected
    values, indices = torch.sort(b)
    found = accesses(aten.sort.default, (b,), outputs=(values, indices))
    assert (ptr(values), True) in found and (ptr(indices), True) in found


def test_empty_factories_allocate_and_write_nothing():
    e = torch.empty(3)
    [found] = op_accesses(aten.empty.memory_format, ([3],), {}, e, lambda t: True)
    assert (found.storage, found.fresh, found.accessed, found.is_write) == (ptr(e), True, False, False)


def test_in_place_view_ops_touch_no_data():
    a = torch.ones(4, 4)
    assert accesses(aten.t_.default, (a,), outputs=a) == []
    assert accesses(aten.unsqueeze_.default, (a, 0), outputs=a) == []


def test_batch_norm_writes_its_running_statistics_in_training_only():
    """native_batch_norm's schema does not declare the update of running_mean and running_var."""
    x, mean, var = torch.randn(4, 3), torch.zeros(3), torch.ones(3)
    for training in (True, False):
        args = (x, None, None, mean, var, training, 0.1, 1e-5)
        found = accesses(aten.native_batch_norm.default, args, outputs=aten.native_batch_norm.default(*args))
        assert (ptr(mean), training) in found and (ptr(var), training) in found


def test_functional_fill_and_undeclared_views_read_nothing_of_self():
    a = torch.ones(4)
    filled = aten.fill.Scalar(a, 2.0)
    assert accesses(aten.fill.Scalar, (a, 2.0), outputs=filled) == [(ptr(filled), True)]
    assert accesses(aten._unsafe_view.default, (a, [2, 2]), outputs=aten._unsafe_view.default(a, [2, 2])) == []
    parts = aten.unsafe_split.Tensor(a, 2)
    assert accesses(aten.unsafe_split.Tensor, (a, 2), outputs=parts) == []


def test_an_out_tensor_the_op_resizes_is_a_fresh_output():
    a, out = torch.ones(4), torch.empty(0)
    before = written_storages(plan(aten.add.out), (a, a), {"out": out})
    aten.add.out(a, a, out=out)
    found = op_accesses(aten.add.out, (a, a), {"out": out}, out, lambda t: True, written_before=before)
    [entry] = [x for x in found if x.storage == ptr(out)]
    assert entry.fresh and entry.is_write and entry.accessed


def test_an_out_tensor_resized_on_a_side_stream_is_allocated_there():
    """Before: taken for a storage from before tracking, on the default stream, so its free after a use
    on the side stream was an uncovered free."""
    san = LifetimeSanitizer("sim", on_race="collect", warn_on_free=False)
    with san:
        side = sd.Stream()
        a = torch.ones(8)
        side.wait_stream(sd.default_stream())
        with sd.stream(side):
            out = torch.empty(0)
            torch.add(a, a, out=out)
            out.sum()
        npu_lifetime.record_use(a, side)
        del out
        gc.collect()
    assert san.flush() == []


def test_views_of_one_storage_are_one_access():
    a = torch.ones(8)
    out = a[:4] + a[4:]
    assert accesses(aten.add.Tensor, (a[:4], a[4:]), outputs=out) == sorted([(ptr(a), False), (ptr(out), True)])



def buggy(san):
    side = sd.Stream()
    x = torch.ones(64)  # line: allocation
    side.wait_stream(sd.default_stream())
    with sd.stream(side):
        y = x * 3  # line: the use
    del x  # line: the free
    gc.collect()
    return y


def test_free_findings_are_retained_with_sites_and_fix():
    san = LifetimeSanitizer("sim", on_race="collect", warn_on_free=False)
    with san:
        buggy(san)
    [f] = san.findings
    assert isinstance(f, UncoveredFree) and not f.live
    assert f.last_use.op == "aten::mul"
    text = san.report()
    assert "x = torch.ones(64)" not in text  # sites are file:line, not source
    assert "test_sanitizer_frontend.py" in text and "in buggy" in text
    assert "record_use" in text and "wait_stream" in text
    assert san.flush() == [f] and san.flush() == []


def test_json_form_of_findings():
    san = LifetimeSanitizer("sim", on_race="collect", warn_on_free=False)
    with san:
        buggy(san)
    [entry] = json.loads(json.dumps(san.to_json()))
    assert entry["kind"] == "uncovered_free" and entry["usage_stream"].startswith("sim stream")
    assert entry["last_use"]["op"] == "aten::mul" and entry["alloc_site"][0]["function"] == "buggy"
    assert entry["fix"] and entry["text"].startswith("[uncovered free, latent]")
    # latent is the diagnosis; the verdict is the contract's: it fails
    assert entry["actual"] is False and entry["fails"] is True and entry["count"] == 1
    assert "not reused" in entry["latent_reasons"][0]["reason"]
    assert "sim stream" in entry["fix"] and "(0, " not in entry["fix"]  # named, not raw keys


def test_flush_reports_live_storages_per_usage_stream():
    san = LifetimeSanitizer("sim", on_race="collect", warn_on_free=False)
    with san:
        x, side = used_on_side()
        grouped = san.flush_by_stream()
    name = san.describe(side.key)  # the device's name, and the variable the stream was assigned to
    assert name == f"sim stream {side.handle} (`side`)" and list(grouped) == [name]
    [f] = grouped[name]
    assert f.live


def test_on_race_raise_warn_collect():
    def racy():
        side = sd.Stream()
        x = torch.ones(8)
        with sd.stream(side):
            x.add_(1)

    with pytest.raises(DataRaceError) as err:
        with LifetimeSanitizer("sim", on_race="raise", warn_on_free=False):
            racy()
    assert isinstance(err.value.races[0], DataRace) and "write-after-write" in str(err.value)
    with pytest.warns(LifetimeWarning, match="data race"):
        with LifetimeSanitizer("sim", on_race="warn", warn_on_free=False):
            racy()
    san = LifetimeSanitizer("sim", on_race="collect", warn_on_free=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with san:
            racy()
    assert [f.race for f in san.findings if isinstance(f, DataRace)] == ["write-after-write"]


def test_uncovered_free_warns_by_default():
    with pytest.warns(LifetimeWarning, match="uncovered free"):
        with LifetimeSanitizer("sim", on_race="collect"):
            x, side = used_on_side()
            del x
            gc.collect()


def test_a_disabled_sanitizer_reports_nothing():
    san = LifetimeSanitizer("sim", on_race="collect", warn_on_free=False)
    san.enable()
    san.disable()
    buggy(san)
    assert san.flush() == []


def test_tensors_from_before_enabling_are_taken_as_ordered():
    x = torch.ones(8)
    san = LifetimeSanitizer("sim", on_race="raise", warn_on_free=False)
    with san:
        side = sd.Stream()
        with sd.stream(side):
            x.sum()  # no race with an allocation nobody saw
        npu_lifetime.record_use(x, side)
    assert san.flush() == []


def test_bad_arguments():
    with pytest.raises(ValueError, match="on_race"):
        LifetimeSanitizer("sim", on_race="explode")
    with pytest.raises(ValueError, match="device must be one of"):
        LifetimeSanitizer("tpu")
    with pytest.raises(npu_lifetime.recording.RecordUseError, match="needs a tensor"):
        npu_lifetime.record_use([1, 2], sd.Stream())
    with pytest.raises(npu_lifetime.recording.RecordUseError, match="needs the shim"):
        npu_lifetime.erase_stream(torch.ones(1), torch.Stream())


def test_environment_variable_enables_a_process_sanitizer():
    code = (
        "import torch, gc; from npu_lifetime import simdevice as sd;"
        "import npu_lifetime.sanitizer as s;"
        "side = sd.Stream(); x = torch.ones(4); side.wait_stream(sd.default_stream());\n"
        "with sd.stream(side): x.sum()\n"
        "del x; gc.collect(); print(len(s.flush_findings()), s.process_sanitizer().enabled)"
    )
    env = dict(os.environ, NPU_LIFETIME_SANITIZER="sim", PYTHONWARNINGS="ignore")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.split() == ["1", "True"]


def test_erase_stream_withdraws_record_stream_on_the_simulated_device():
    san = LifetimeSanitizer("sim", on_race="collect", warn_on_free=False)
    with san:
        x, side = used_on_side()
        npu_lifetime.record_stream(x, side)
        npu_lifetime.erase_stream(x, side)
        del x
        gc.collect()
    assert [f.kind for f in san.flush()] == ["uncovered_free"]


def test_wrapper_subclasses_stand_for_their_inner_tensors():
    from torch.testing._internal.two_tensor import TwoTensor

    a, b = torch.ones(4), torch.zeros(4)
    pair = TwoTensor(a, b)
    found = accesses(aten.mul.Tensor, (pair, 2.0), outputs=torch.ones(4))
    assert (ptr(a), False) in found and (ptr(b), False) in found


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_a_device_the_machine_lacks_is_an_error_not_a_silent_pass():
    from npu_lifetime.sanitizer import DeviceUnavailable

    with pytest.raises(DeviceUnavailable, match="no CUDA device"):
        LifetimeSanitizer("cuda")
    # asked for by name (1 and auto mean the device present: tests/cli/test_front_door_switches.py)
    env = dict(os.environ, NPU_LIFETIME_SANITIZER="cuda", PYTHONWARNINGS="ignore")
    done = subprocess.run([sys.executable, "-c", "import npu_lifetime.sanitizer"],
                          capture_output=True, text=True, env=env)
    assert done.returncode == 2 and "no CUDA device" in done.stderr and "Traceback" not in done.stderr
