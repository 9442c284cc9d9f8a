"""The shim's hooks relayed to their Python subscribers: by _hook_relay.c
(the C functions the shim calls) and by the ctypes callbacks of hooks.py
(where it is not built, or NPU_LIFETIME_NATIVE=0), the same way: each
subscriber sees each allocation and free with its arguments, ``on_findings``
runs only after a free whose ``on_free`` returned findings, and a subscriber
that raises is reported while the others still run."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from npu_lifetime.shim import hooks

PROGRAM = textwrap.dedent("""
    import json
    from npu_lifetime import shim
    from npu_lifetime.shim import hooks
    shim.select_runtime("sim")
    seen = []

    def on_free(*args):
        seen.append(["free", *args])
        return ["a finding"] if args[1] == 8192 else []

    def boom(*args):
        raise RuntimeError("this subscriber failed")

    hooks.subscribe(boom, boom)
    hooks.subscribe(lambda *args: seen.append(["alloc", *args]), on_free,
                    lambda ptr, found: seen.append(["findings", ptr, found]))
    p = shim.alloc(4096, 0, 0x10)
    q = shim.alloc(8192, 0, 0x20)
    shim.free(p, 4096, 0, 0x10)
    shim.free(q, 8192, 0, 0x20)
    print(json.dumps({"relay": hooks.relay is not None, "seen": seen, "p": p, "q": q}))
""")


def _run(native: str) -> tuple:
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, NPU_LIFETIME_NATIVE=native))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


@pytest.mark.parametrize("native", ["1", "0"], ids=["relay", "ctypes"])
def test_each_subscriber_sees_every_allocation_and_free_and_findings_only_when_there_are_some(native):
    if native == "1" and hooks.relay is None:
        pytest.skip("_hook_relay was not built")
    result, stderr = _run(native)
    assert result["relay"] is (native == "1")
    p, q = result["p"], result["q"]
    assert result["seen"] == [
        ["alloc", p, 4096, 0, 0x10], ["alloc", q, 8192, 0, 0x20],
        ["free", p, 4096, 0, 0x10], ["free", q, 8192, 0, 0x20],
        ["findings", q, ["a finding"]],  # after q's free only: p's on_free returned none
    ]
    # the raising subscriber was reported at each of the four calls, and the next one still ran
    assert stderr.count("this subscriber failed") == 4


def test_the_relay_rejects_a_malformed_subscriber_list():
    if hooks.relay is None:
        pytest.skip("_hook_relay was not built")
    with pytest.raises(TypeError):
        hooks.relay.set_subscribers([(None, None, None)])
    with pytest.raises(TypeError):
        hooks.relay.set_subscribers(((None, None),))
