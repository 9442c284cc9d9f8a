"""The FSDP2 migration on CPU: the version check, the patches going in and
out cleanly, and torch's own fully_shard trained over gloo on two processes
with its hand-offs migrated: same losses, no stash held, every hand-off seen.
(On CPU there is no stream to outlive, so record_use itself is exercised on
the GPU: test_gpu_fsdp2.py.)"""
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from npu_lifetime import fsdp2

pytestmark = pytest.mark.usefixtures("both_ways")  # conftest.py: C parts, then Python's

ROOT = Path(__file__).resolve().parents[2]


def test_this_torch_is_a_known_fsdp2():
    profile = fsdp2.check_version()
    assert torch.__version__.startswith(profile.torch_version)


def test_an_unknown_fsdp2_is_refused_naming_what_differs(monkeypatch):
    changed = dict(fsdp2.fingerprints())
    changed["_fsdp_param_group:FSDPParamGroup.post_backward"] = "0" * 16
    monkeypatch.setattr(fsdp2, "fingerprints", lambda: changed)
    with pytest.raises(fsdp2.FSDP2VersionError, match=r"differs in FSDPParamGroup\.post_backward") as err:
        fsdp2.Handoffs()
    assert "torch 2.11" in str(err.value) and "torch 2.13" in str(err.value)


def test_a_new_reader_of_a_stash_is_an_unknown_version(monkeypatch):
    found = dict(fsdp2.fingerprints(), **{"_fsdp_state:FSDPState.some_new_hook": "1" * 16})
    monkeypatch.setattr(fsdp2, "fingerprints", lambda: found)
    with pytest.raises(fsdp2.FSDP2VersionError, match="some_new_hook"):
        fsdp2.check_version()


def test_without_fsdp2_sources_the_error_says_what_is_supported(monkeypatch):
    def missing():
        raise ImportError("no torch.distributed.fsdp here")

    monkeypatch.setattr(fsdp2, "_modules", missing)
    with pytest.raises(fsdp2.FSDP2VersionError, match="supports the FSDP2 of torch 2.11, 2.13"):
        fsdp2.check_version()


def test_patches_go_in_and_come_out_exactly():
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group as pg

    names = ("foreach_all_gather_copy_out", "foreach_reduce", "AllGatherState", "ReduceScatterState",
             "AllReduceState")
    before = {n: getattr(pg, n) for n in names}
    methods = {n: vars(pg.FSDPParamGroup)[n] for n in ("wait_for_unshard", "post_backward",
                                                        "_wait_all_gather_streams_on_event")}
    with fsdp2.use_record_use():
        assert all(getattr(pg, n) is not before[n] for n in names)
        with pytest.raises(RuntimeError, match="already patched"):
            fsdp2.Handoffs(fsdp2.RECIPE).enable()
    assert {n: getattr(pg, n) for n in names} == before
    assert {n: vars(pg.FSDPParamGroup)[n] for n in methods} == methods
    with fsdp2.Handoffs(fsdp2.RECIPE):  # the recipe only observes: the stash types stay
        assert pg.AllGatherState is before["AllGatherState"]


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="mode must be one of"):
        fsdp2.Handoffs("record_use_please")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def gloo_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp2")
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={_free_port()}",
         str(ROOT / "examples/fsdp2_record_use.py"), "--device", "cpu", "--width", "32", "--layers", "2",
         "--batch", "2", "--seq", "8", "--check-steps", "2", "--phases", "modes,hsdp",
         "--modes", f"{fsdp2.RECIPE},{fsdp2.RECORD_USE}", "--json", str(out)],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    reports = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    for r in reports:
        assert r["errors"] == {}, r["errors"]
    return reports


def test_fsdp2_trains_identically_with_its_hand_offs_migrated(gloo_run):
    for report in gloo_run:
        modes = report["modes"]
        recipe, migrated = modes[fsdp2.RECIPE], modes[fsdp2.RECORD_USE]
        assert migrated["losses"] == recipe["losses"]  # bitwise: same kernels, same order
        assert migrated["handoffs"] == recipe["handoffs"]
        assert recipe["handoffs"]["all_gather_output"] > 0 and recipe["handoffs"]["reduce_scatter_input"] > 0


def test_the_recipe_stashes_and_the_migration_never_does(gloo_run):
    for report in gloo_run:
        modes = report["modes"]
        assert modes[fsdp2.RECIPE]["stashed"]["all_gather_output"] > 0  # forward keeps it for the next group
        assert modes[fsdp2.RECIPE]["stashed"]["reduce_scatter_input"] > 0
        assert modes[fsdp2.RECIPE]["waits_skipped"] == 0
        assert set(modes[fsdp2.RECORD_USE]["stashed"].values()) == {0}
        assert modes[fsdp2.RECORD_USE]["waits_skipped"] > 0  # backward's copy-out waits, replaced


def test_hsdp_all_reduce_hand_off_is_migrated_too(gloo_run):
    for report in gloo_run:
        hsdp = report["hsdp"]
        assert hsdp["losses_identical"]
        assert hsdp[fsdp2.RECIPE]["handoffs"]["all_reduce_input"] > 0
        assert hsdp[fsdp2.RECIPE]["stashed"]["all_reduce_input"] > 0
        assert hsdp[fsdp2.RECORD_USE]["stashed"]["all_reduce_input"] == 0
