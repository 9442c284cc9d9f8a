"""NPU_LIFETIME_NATIVE=0 turns off every optional C extension (native_parts.py):
the sanitizer's, the shim's hook relay and the torch-allocator fallback's holds
(which ignored the switch before), so the pure-Python paths run, a sanitizer
at work included."""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROGRAM = """
import json, sys
from npu_lifetime.sanitizer import native, threads
from npu_lifetime.recording import torch_allocator_fallback
from npu_lifetime.shim import hooks
from npu_lifetime.lifetime import model_class
loaded = sorted(name for name, module in sys.modules.items()
                if name.startswith("npu_lifetime.") and getattr(module, "__file__", "") and
                module.__file__.endswith(".so"))
print(json.dumps({"loaded": loaded, "table": torch_allocator_fallback.Table.__module__}))
"""


def _run(native: str) -> dict:
    import json
    import os

    env = dict(os.environ, NPU_LIFETIME_NATIVE=native)
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_switch_turns_every_extension_off():
    off = _run("0")
    assert off["loaded"] == [], off
    assert off["table"].endswith("_holds_py")


# every optional extension setup.py builds (its OPTIONAL_EXTENSIONS list)
_SETUP = (ROOT / "setup.py").read_text()
EXTENSIONS = sorted(re.findall(r'Extension\("([\w.]+)"',
                               _SETUP[_SETUP.index("OPTIONAL_EXTENSIONS = ["):_SETUP.index("\n]\n")]))


def test_without_the_switch_every_extension_is_built_and_loads():
    """Each C part builds (a failed optional build only warns at install,
    and an old .so left in place can hide it) and is loaded."""
    on = _run("1")
    assert on["loaded"] == EXTENSIONS, set(EXTENSIONS) ^ set(on["loaded"])
    assert on["table"].endswith("._holds")


# a sanitizer at work on the simulated device: a race, a host thread, a free, a report, a recording
AT_WORK = """
import json, sys, threading
import torch
import npu_lifetime
from npu_lifetime import simdevice as sd
from npu_lifetime.sanitizer import LifetimeSanitizer, native
from npu_lifetime.viz.recorder import Recorder

Recorder()
with LifetimeSanitizer("sim", on_race="collect") as san:
    x = torch.ones(64)
    side = sd.Stream()
    with sd.stream(side):
        x.add_(1)
    y = x * 2
    worker = threading.Thread(target=lambda: y.sum())
    worker.start()
    worker.join()
    del x, y
found = san.flush()
san.report(found)
print(json.dumps({"parts": native.default().name, "kinds": sorted({f.kind for f in found}),
                  "modules": sorted(sys.modules)}))
"""


def _extensions_on_disk() -> list:
    """Every extension module of the package built here (``_*.so`` or
    ``.pyd`` files under npu_lifetime/), by module name: a new one is not
    forgotten."""
    found = [*ROOT.glob("npu_lifetime/**/_*.so"), *ROOT.glob("npu_lifetime/**/_*.pyd")]
    return sorted(".".join(path.relative_to(ROOT).with_suffix("").with_suffix("").parts) for path in found)


def test_a_sanitizer_at_work_loads_no_extension_with_the_switch_off():
    on_disk = _extensions_on_disk()
    if not on_disk:
        import pytest

        pytest.skip("no extension is built here (python setup.py build_ext --inplace)")
    assert set(EXTENSIONS) <= set(on_disk), set(EXTENSIONS) - set(on_disk)  # the glob sees each of them
    env = dict(__import__("os").environ, NPU_LIFETIME_NATIVE="0")
    done = subprocess.run([sys.executable, "-c", AT_WORK], capture_output=True, text=True, env=env, timeout=300,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    import json

    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["parts"] == "python" and "data_race" in result["kinds"], result["kinds"]
    loaded = set(on_disk) & set(result["modules"])
    assert not loaded, loaded
