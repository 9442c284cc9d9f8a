"""A second, independent oracle on the GPU: compute-sanitizer's tracking of
stream-ordered allocations (``--tool memcheck --track-stream-ordered-races
all``).  Under torch's ``cudaMallocAsync`` backend every tensor's memory is
a stream-ordered allocation freed with ``cudaFreeAsync`` on its stream, so a
use the free is not ordered after is reported as a use-after-free.  It
tracks lifetimes only: a race between two accesses of live memory (an
ordering bug) is not its to see.

``python -m npu_lifetime.corpus.oracle`` runs every form once between
markers; ``run()`` starts that under compute-sanitizer and counts the
errors it reports inside each form's markers."""
from __future__ import annotations

import os
import re
import subprocess
import sys

BEGIN, END = "npu-lifetime-corpus begin", "npu-lifetime-corpus end"
_ERROR = re.compile(r"^========= (?!ERROR SUMMARY|COMPUTE-SANITIZER|Saved host|Target application|Program hit|\s)"
                    r"(.+)$")


def command(names=None) -> list:
    args = [sys.executable, "-m", "npu_lifetime.corpus.oracle"]
    for name in names or ():
        args += ["--case", name]
    return ["compute-sanitizer", "--tool", "memcheck", "--track-stream-ordered-races", "all",
            "--print-limit", "1000", *args]


def run(names=None, timeout: float = 900) -> tuple:
    """(case -> form -> errors, the whole log)."""
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="backend:cudaMallocAsync")
    done = subprocess.run(command(names), env=env, capture_output=True, text=True, timeout=timeout)
    log = done.stdout + done.stderr
    return parse(log), log


def parse(log: str) -> dict:
    counts: dict = {}
    current = None
    for line in log.splitlines():
        if line.startswith(BEGIN):
            name, form = line[len(BEGIN):].split()
            current = counts.setdefault(name, {}).setdefault(form, [])
        elif line.startswith(END):
            current = None
        elif current is not None and _ERROR.match(line):
            current.append(_ERROR.match(line).group(1))
    return {name: {form: len(errors) for form, errors in forms.items()} for name, forms in counts.items()}


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

    import torch

    from . import case_modules
    from .device import CorpusDevice

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--case", action="append")
    args = parser.parse_args()
    dev = CorpusDevice("cuda")
    for name, module in case_modules().items():
        if (args.case and name not in args.case) or "cuda" not in module.CASE.devices:
            continue
        for form in module.CASE.forms:
            print(f"{BEGIN} {name} {form}", flush=True)
            module.program(dev, form)
            _settle()
            print(f"{END} {name} {form}", flush=True)


if __name__ == "__main__":
    main()
