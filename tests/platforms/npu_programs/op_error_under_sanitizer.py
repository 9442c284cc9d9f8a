"""An op that fails on npu (the stand-in has no `all` kernel) under the
lifetime sanitizer: the program must see torch_npu's RuntimeError, as it
does without the sanitizer.  Prints what it caught, as JSON."""
import json
import sys

import torch
import torch_npu  # noqa: F401

from npu_lifetime.sanitizer import LifetimeSanitizer

x = torch.ones(1024, device="npu")
caught = {}
with LifetimeSanitizer("npu", on_race="collect") if sys.argv[1:] == ["sanitized"] else open("/dev/null"):
    try:
        bool((x == 1).all())
    except BaseException as err:  # noqa: BLE001
        caught = {"type": type(err).__name__, "message": str(err).splitlines()[0][:200]}
print(json.dumps(caught))
