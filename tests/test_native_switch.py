"""NPU_LIFETIME_NATIVE=0 turns off every optional C extension (native_parts.py):
the sanitizer's, the shim's hook relay and the native fallback's holds
(which ignored the switch before), so the pure-Python paths run."""
import subprocess
import sys

PROGRAM = """
import json, sys
from npu_lifetime.sanitizer import native, threads
from npu_lifetime.recording import native_fallback
from npu_lifetime.shim import hooks
loaded = sorted(name for name, module in sys.modules.items()
                if name.startswith("npu_lifetime.") and getattr(module, "__file__", "") and
                module.__file__.endswith(".so"))
print(json.dumps({"loaded": loaded, "table": native_fallback.Table.__module__}))
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


def test_without_the_switch_the_extensions_load():
    on = _run("1")
    assert "npu_lifetime.recording._holds" in on["loaded"]
    assert on["table"].endswith("._holds")
    assert "npu_lifetime.sanitizer._threads" in on["loaded"]
