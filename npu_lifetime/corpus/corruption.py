"""Each form on a real device, under the shim's debug mode (freed blocks are
poisoned and quarantined) with a slow kernel where the case puts one: does
the bug show in the data?  Runs in a process of its own, since the shim must
become the allocator before the device allocates anything:
``python -m npu_lifetime.corpus.corruption --device cuda`` prints one JSON
object, case -> form -> intact."""
from __future__ import annotations

import argparse
import json
import sys


def run(device: str, names=None) -> dict:
    import npu_lifetime

    from . import case_modules
    from .device import CorpusDevice

    npu_lifetime.install(device, debug=True)
    dev = CorpusDevice(device, slow=True)
    seen = {}
    for name, module in case_modules().items():
        if (names and name not in names) or device not in module.CASE.devices:
            continue
        seen[name] = {}
        for form in module.CASE.forms:
            try:
                seen[name][form] = bool(module.program(dev, form))
                dev.synchronize()
            except Exception as err:  # noqa: BLE001  (one form's failure is that form's result)
                seen[name][form] = f"failed: {type(err).__name__}: {str(err).splitlines()[0]}"
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", choices=("cuda", "npu"), required=True)
    parser.add_argument("--case", action="append")
    args = parser.parse_args()
    json.dump(run(args.device, args.case), sys.stdout)
    print()


if __name__ == "__main__":
    main()
