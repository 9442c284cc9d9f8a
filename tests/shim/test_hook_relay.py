"""The shim's hooks relayed to their Python subscribers: by _hook_relay.c
(the C functions the shim calls) and by the ctypes callbacks of hooks.py
(where it is not built, or NPU_LIFETIME_NATIVE=0), the same way, one test
body for both (conftest.py's hooks_both_ways): each subscriber sees each
allocation and free with its arguments, ``on_findings`` runs only after a
free whose ``on_free`` returned findings, and a subscriber that raises is
reported while the others still run."""
import sys

import pytest

from npu_lifetime import shim
from npu_lifetime.shim import hooks

pytestmark = pytest.mark.usefixtures("hooks_both_ways")


def test_each_instance_relays_through_its_own_hooks(hooks_both_ways):
    assert (hooks.relay is not None) == (hooks_both_ways == "native")


def test_each_subscriber_sees_every_allocation_and_free_and_findings_only_when_there_are_some(
        sim_shim, monkeypatch, capsys):
    seen, reported = [], []
    # the relay reports a failing subscriber as unraisable, the ctypes callbacks print it
    monkeypatch.setattr(sys, "unraisablehook", lambda u: reported.append(str(u.exc_value)))

    def on_free(*args):
        seen.append(["free", *args])
        return ["a finding"] if args[1] == 8192 else []

    def boom(*args):
        raise RuntimeError("this subscriber failed")

    subscriptions = [hooks.subscribe(boom, boom),
                     hooks.subscribe(lambda *args: seen.append(["alloc", *args]), on_free,
                                     lambda ptr, found: seen.append(["findings", ptr, found]))]
    try:
        p = shim.alloc(4096, 0, 0x10)
        q = shim.alloc(8192, 0, 0x20)
        shim.free(p, 4096, 0, 0x10)
        shim.free(q, 8192, 0, 0x20)
    finally:
        for sub in subscriptions:
            hooks.unsubscribe(sub)
    assert seen == [
        ["alloc", p, 4096, 0, 0x10], ["alloc", q, 8192, 0, 0x20],
        ["free", p, 4096, 0, 0x10], ["free", q, 8192, 0, 0x20],
        ["findings", q, ["a finding"]],  # after q's free only: p's on_free returned none
    ]
    # the raising subscriber was reported at each of the four calls, and the next one still ran
    printed = capsys.readouterr().err.count("RuntimeError: this subscriber failed")
    assert printed + reported.count("this subscriber failed") == 4


def test_the_relay_rejects_a_malformed_subscriber_list(hooks_both_ways):
    if hooks_both_ways == "python":
        pytest.skip("the relay's own argument checks")
    with pytest.raises(TypeError):
        hooks.relay.set_subscribers([(None, None, None)])
    with pytest.raises(TypeError):
        hooks.relay.set_subscribers(((None, None),))
