"""The data-tag reuse fuzz (tools/reuse_fuzz.py) on the simulated runtime:
no seed of a short run sees an old owner's write land after a reuse, with
cross-stream reuse on and off, and the fuzz does see it against shims built
to reuse too early (a test that could not fail would prove nothing)."""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.shim_testing import build_shim

TOOL = Path(__file__).resolve().parents[2] / "tools" / "reuse_fuzz.py"


def _fuzz_module():
    spec = importlib.util.spec_from_file_location("reuse_fuzz", TOOL)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("mode", ["off", "idle", "always"])
def test_no_seed_sees_an_early_reuse(sim_shim, mode):
    result = _fuzz_module().fuzz(range(50), mode, 80, lambda *_: None)
    assert result["failures"] == []
    assert result["reuses"] > 100  # reuse really happened, many times
    assert result["out_of_memory_answers"] > 0  # and the out-of-memory path ran
    assert result["seeds_by_cross_stream_mode"][mode] == 50
    assert (result["cross_stream_segments"] > 0) == (mode != "off")  # segments really moved, or never
    assert result["unmerged_reuses"] > 0  # the pair step's allocations took the cached pair's shortcut


@pytest.mark.parametrize("mutant, cross_stream", [("-DNPL_MUTANT_CROSS_STREAM", "always"),
                                                  ("-DNPL_MUTANT_CROSS_STREAM", "idle"),
                                                  ("-DNPL_MUTANT_HELD_WAIT", "off")])
def test_the_fuzz_catches_a_shim_that_reuses_too_early(tmp_path, mutant, cross_stream):
    """Without the cross-stream wait, or without the wait on a block's
    pending uses (record_use, record_stream), some seeds see a wrong tag."""
    library = build_shim(tmp_path, mutant)
    done = subprocess.run([sys.executable, str(TOOL), "--seeds", "60", "--cross-stream", cross_stream],
                          capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, NPU_LIFETIME_SHIM=str(library)))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "not its tag" in done.stdout, done.stdout


def test_the_fuzz_catches_a_repeated_pair_left_uncounted(tmp_path):
    """With the checker run every 7th step, repeats of the cached pair run
    on between checks (every check is an entry point, which settles them):
    a shim whose settlement forgets a repeat's allocation breaks the
    statistics the checker compares with the blocks."""
    library = build_shim(tmp_path, "-DNPL_MUTANT_PAIR_SETTLE")
    done = subprocess.run([sys.executable, str(TOOL), "--seeds", "60", "--check-every", "7"],
                          capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, NPU_LIFETIME_SHIM=str(library)))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "allocator invariants broken" in done.stdout and "the blocks say" in done.stdout, done.stdout
