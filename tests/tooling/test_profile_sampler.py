"""benchmarks/profile: the in-process sampler samples only the main thread
between npl_sampler_start/stop, and symbolize.py / breakdown.py read what it
wrote (the tools behind the sanitizer's GPU profile, design/notebook)."""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "benchmarks" / "profile"
CC = shutil.which("cc") or shutil.which("gcc")
pytestmark = pytest.mark.skipif(CC is None or shutil.which("addr2line") is None,
                                reason="needs a C compiler and binutils' addr2line")

# Two static C functions (named only through addr2line, as our extensions'
# are): one busy inside the timed region, one before and after it.
WORK = r"""
static volatile unsigned long sink;
__attribute__((noinline)) static void spin_inside(long n) { for (long i = 0; i < n; i++) sink += i * i; }
__attribute__((noinline)) static void spin_outside(long n) { for (long i = 0; i < n; i++) sink ^= i + 7; }
void inside(long n) { spin_inside(n); }
void outside(long n) { spin_outside(n); }
"""
PROGRAM = """
import ctypes, sys
process, work = ctypes.CDLL(None), ctypes.CDLL(sys.argv[1])
work.outside(150_000_000)
process.npl_sampler_start()
work.inside(150_000_000)
process.npl_sampler_stop()
work.outside(150_000_000)
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple:
    folder = tmp_path_factory.mktemp("sampler")
    (folder / "work.c").write_text(WORK)
    subprocess.run([CC, "-O1", "-g", "-shared", "-fPIC", str(folder / "work.c"), "-o", str(folder / "work.so")],
                   check=True)
    subprocess.run([CC, "-O2", "-shared", "-fPIC", "-Wall", "-Wextra", "-Werror",
                    str(PROFILE / "sampler.c"), "-o", str(folder / "sampler.so")], check=True)
    return folder / "sampler.so", folder / "work.so"


@pytest.fixture
def sampler(built) -> Path:
    return built[0]


@pytest.fixture
def work(built) -> Path:
    return built[1]


def _sample(sampler: Path, work: Path, out: Path, manual: bool):
    env = dict(os.environ, SAMPLER_OUT=str(out), SAMPLER_US="1000", LD_PRELOAD=str(sampler))
    if manual:
        env["SAMPLER_MANUAL"] = "1"
    return subprocess.run([sys.executable, "-c", PROGRAM, str(work)], env=env, capture_output=True, text=True,
                          check=True)


def _run_tool(*args: str) -> str:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, check=True).stdout


def test_manual_sampling_sees_the_timed_region_only(sampler, work, tmp_path):
    stacks = tmp_path / "stacks.txt"
    done = _sample(sampler, work, stacks, manual=True)
    assert "sampler:" in done.stderr
    assert len(stacks.read_text().splitlines()) >= 5, done.stderr
    report = _run_tool(str(PROFILE / "symbolize.py"), str(stacks), "--top", "400")
    assert "spin_inside" in report  # named by addr2line: a static function
    assert "spin_outside" not in report  # it ran before start and after stop


def test_automatic_sampling_sees_the_whole_run_and_breakdown_counts_every_sample(sampler, work, tmp_path):
    stacks = tmp_path / "stacks.txt"
    _sample(sampler, work, stacks, manual=False)
    report = _run_tool(str(PROFILE / "symbolize.py"), str(stacks), "--top", "400")
    assert "spin_inside" in report and "spin_outside" in report
    samples = sum(int(line.rpartition(" ")[2]) for line in stacks.read_text().splitlines())
    breakdown = _run_tool(str(PROFILE / "breakdown.py"), str(stacks))
    assert f"{samples} samples" in breakdown
    assert "torch and Python" in breakdown  # no library of ours in a plain interpreter


def test_a_wrapper_process_does_not_overwrite_the_samples(sampler, work, tmp_path):
    """The preload reaches a wrapper too (timeout, a shell), which exits after
    the sampled program: having taken no samples it must not truncate the
    file (on the GPU host every profile came back empty that way)."""
    stacks = tmp_path / "stacks.txt"
    env = dict(os.environ, SAMPLER_OUT=str(stacks), SAMPLER_US="1000", LD_PRELOAD=str(sampler), SAMPLER_MANUAL="1")
    wrapped = f"{shlex.quote(sys.executable)} -c {shlex.quote(PROGRAM)} {shlex.quote(str(work))}; sleep 0.2"
    subprocess.run(["sh", "-c", wrapped], env=env, capture_output=True, text=True, check=True)
    assert len(stacks.read_text().splitlines()) >= 5
