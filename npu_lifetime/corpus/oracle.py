"""A second, independent oracle on the GPU: compute-sanitizer's tracking of
stream-ordered allocations (``--tool memcheck --track-stream-ordered-races
all``).  Under torch's ``cudaMallocAsync`` backend every tensor's memory is
a stream-ordered allocation freed with ``cudaFreeAsync`` on its stream, so a
use the free is not ordered after is reported as a use-after-free.  It
tracks lifetimes only: a race between two accesses of live memory (an
ordering bug) is not its to see.

``python -m npu_lifetime.corpus.oracle --case C --form F`` runs one form;
``run()`` starts each form in a compute-sanitizer process of its own (a
reported invalid access leaves the CUDA context unusable, so forms cannot
share a process), several at a time, and reads each one's error count."""
from __future__ import annotations

import os
import re
import subprocess
import sys

_SUMMARY = re.compile(r"^========= ERROR SUMMARY: (\d+) errors?", re.MULTILINE)


def command(name: str, form: str) -> list:
    return ["compute-sanitizer", "--tool", "memcheck", "--track-stream-ordered-races", "all",
            "--print-limit", "100", sys.executable, "-m", "npu_lifetime.corpus.oracle", "--case", name, "--form", form]


def run(forms: list, timeout: float = 600, parallel: int = 6) -> tuple:
    """``forms``: (case, form) pairs.  Returns (case -> form -> errors, or
    None where compute-sanitizer gave no summary; case -> form -> log)."""
    from concurrent.futures import ThreadPoolExecutor

    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="backend:cudaMallocAsync")

    def one(pair):
        try:
            done = subprocess.run(command(*pair), env=env, capture_output=True, text=True, timeout=timeout)
            return pair, done.stdout + done.stderr
        except subprocess.TimeoutExpired:
            return pair, f"compute-sanitizer did not finish in {timeout:.0f} s"

    counts: dict = {}
    logs: dict = {}
    with ThreadPoolExecutor(parallel) as pool:
        for (name, form), log in pool.map(one, forms):
            counts.setdefault(name, {})[form] = errors(log)
            logs.setdefault(name, {})[form] = log
    return counts, logs


def errors(log: str):
    """The error count compute-sanitizer's summary gives, or None without one."""
    found = _SUMMARY.search(log)
    return int(found.group(1)) if found else None


def _settle() -> None:
    """Everything queued has run and every block the form let go is freed
    (record_use's fallback holds a storage until its event fired)."""
    import gc

    import torch

    from ..recording import FALLBACK

    torch.cuda.synchronize()
    gc.collect()
    FALLBACK.reclaim()
    torch.cuda.synchronize()


def main() -> None:
    import argparse

    from . import case_modules
    from .device import CorpusDevice

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--case", required=True, choices=list(case_modules()))
    parser.add_argument("--form", required=True)
    args = parser.parse_args()
    case_modules()[args.case].program(CorpusDevice("cuda"), args.form)
    _settle()


if __name__ == "__main__":
    main()
