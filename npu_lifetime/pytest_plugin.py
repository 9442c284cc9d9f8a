"""pytest plugin: ``@pytest.mark.lifetime_sanitizer`` or the
``lifetime_sanitizer`` fixture runs a test under the lifetime sanitizer and
fails it with the report when findings fail the check.

    @pytest.mark.lifetime_sanitizer(device="cuda")
    def test_handoff(): ...

    def test_other(lifetime_sanitizer):   # the sanitizer itself, to inspect
        ...

Marker arguments (any other is an error): ``device`` (``auto``, ``cuda``,
``npu``, ``sim``; a device the machine lacks skips the test, saying why),
``allow_latent``, ``suppressions`` (a suppressions file; default
``$NPU_LIFETIME_SUPPRESSIONS``), ``strict``, ``live``.

What fails a test is the contract: every data race and reuse race, every
uncovered free (latent or actual: the classification is the report's
diagnosis), invalid frees and uses after free.  Known-safe patterns are
silenced only explicitly: a suppressions file, or ``allow_latent=True``
(a free only the shim's hold kept safe still fails).  ``strict=True`` also
fails, with ``live=True``, the uses of storages still alive at the end that
a free would leave uncovered.

With hypothesis (``@given``), each example runs under a sanitizer of its
own and is checked when it ends: a failing example raises, so hypothesis
shrinks it and prints the minimal one.  The fixture is session-scoped (a
handle on the sanitizer of the test, or of the example, running now), so
``@given`` tests may use it.

The report is printed once: as the failure when findings fail the test,
else (findings that do not fail, or a test failing for its own reason)
attached to the test's output.
"""
from __future__ import annotations

import functools
import gc

import pytest

from npu_lifetime.flags import env_flag, flag

_KEY = "_npu_lifetime_sanitizer"
OPTIONS = ("device", "live", "strict", "allow_latent", "suppressions")
_current: list = []  # the sanitizer of the test (or hypothesis example) running now


class LifetimeCheckFailed(AssertionError):
    """Findings of the lifetime sanitizer fail the test (or the example)."""


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers",
        "lifetime_sanitizer(device='auto', allow_latent=False, suppressions=None, strict=False, live=False): run "
        "the test under the npu_lifetime sanitizer; every race and uncovered free fails it unless silenced "
        "explicitly",
    )


def _wanted(item) -> bool:
    return item.get_closest_marker("lifetime_sanitizer") is not None or \
        "lifetime_sanitizer" in getattr(item, "fixturenames", ())


def _options(item) -> dict:
    marker = item.get_closest_marker("lifetime_sanitizer")
    if marker is None:
        return {}
    if marker.args:
        raise ValueError(f"takes keyword arguments only ({', '.join(OPTIONS)}), not {marker.args!r}")
    unknown = sorted(set(marker.kwargs) - set(OPTIONS))
    if unknown:
        raise ValueError(f"unknown argument{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                         f"known: {', '.join(OPTIONS)}")
    options = dict(marker.kwargs)
    for name in ("live", "strict", "allow_latent"):  # booleans are booleans: "no" would be truthy
        if name in options:
            flag(options[name], name)
    return options


def _resolve(item) -> tuple:
    """The options and the device, checked: a bad marker fails the test, a
    device the machine lacks skips it."""
    from npu_lifetime.sanitizer.backends import DeviceUnavailable, backend_for
    from npu_lifetime.sanitizer.runner import resolve_device
    from npu_lifetime.sanitizer.suppressions import Suppressions, SuppressionsError

    try:
        options = _options(item)
        device = resolve_device(options.get("device", "auto"))
        backend = backend_for(device)
        suppressions = Suppressions.load(options.get("suppressions") or _env_suppressions())
        env_flag("NPU_LIFETIME_ALLOW_LATENT")
    except (ValueError, TypeError, SuppressionsError) as err:
        pytest.fail(f"@pytest.mark.lifetime_sanitizer: {err}", pytrace=False)
    try:
        backend.check_available()
    except DeviceUnavailable as err:
        pytest.skip(f"lifetime_sanitizer(device={device!r}): {err}")
    return options, device, suppressions


def _env_suppressions():
    import os

    return os.environ.get("NPU_LIFETIME_SUPPRESSIONS") or None


def _new_sanitizer(item):
    from npu_lifetime.sanitizer import LifetimeSanitizer

    options, device, suppressions = getattr(item, _KEY)
    return LifetimeSanitizer(device, on_race="collect", warn_on_free=False,
                             strict=options.get("strict", False),
                             allow_latent=options.get("allow_latent", env_flag("NPU_LIFETIME_ALLOW_LATENT")),
                             suppressions=suppressions)


class _Handle:
    """What the fixture gives: the sanitizer of the test or hypothesis
    example running now (attributes are looked up on it)."""

    def __getattr__(self, name):
        if not _current:  # (an AttributeError: tools probing the argument, hypothesis's mock check, see none)
            raise AttributeError(f"{name}: the lifetime_sanitizer fixture is usable inside the test only")
        return getattr(_current[-1], name)

    def __repr__(self) -> str:
        return f"<lifetime_sanitizer of the running test: {_current[-1] if _current else None!r}>"


@pytest.fixture(scope="session")
def lifetime_sanitizer():
    """The sanitizer the test runs under (enabled for the test's body; with
    hypothesis, the running example's)."""
    return _Handle()


def pytest_runtest_setup(item) -> None:
    if _wanted(item):
        setattr(item, _KEY, _resolve(item))
        if getattr(getattr(item, "obj", None), "hypothesis", None) is not None:
            _warm_up(item)


_warmed: set = set()


def _warm_up(item) -> None:
    """Enables and disables a sanitizer once per device before hypothesis's
    first example, so its one-time setup (imports, trace hooks, and torch's
    import of torch._dynamo at the first op under a dispatch mode: seconds)
    does not count against the first example's deadline and make it look
    flaky."""
    device = getattr(item, _KEY)[1]
    if device not in _warmed:
        _warmed.add(device)
        import torch._dynamo  # noqa: F401  (what a dispatch mode's first op imports)

        sanitizer = _new_sanitizer(item)
        sanitizer.enable()
        sanitizer.disable()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    if not _wanted(item) or not hasattr(item, _KEY):
        return (yield)
    handle = getattr(getattr(item, "obj", None), "hypothesis", None)
    if handle is not None and hasattr(handle, "inner_test"):
        return (yield from _per_example(item, handle))
    sanitizer = _start(item)
    try:
        result = yield
    except BaseException:
        text, _ = _finish(item, sanitizer)
        if text:  # the test's own error stays the failure; the findings go with it
            item.add_report_section("call", "npu_lifetime", text)
        raise
    text, failing = _finish(item, sanitizer)
    if failing:
        pytest.fail(text, pytrace=False)
    if text:
        item.add_report_section("call", "npu_lifetime", text)
    return result


def _per_example(item, handle):
    """Each hypothesis example under a sanitizer of its own: findings that
    fail raise inside the example, so hypothesis shrinks the input."""
    inner = handle.inner_test

    @functools.wraps(inner)  # hypothesis prints the example under the test's own name
    def checked(*args, **kwargs):
        __tracebackhide__ = True
        sanitizer = _start(item)
        try:
            inner(*args, **kwargs)
        except BaseException:
            _finish(item, sanitizer)  # the example's own error is what hypothesis shrinks
            raise
        text, failing = _finish(item, sanitizer)
        if failing:
            raise LifetimeCheckFailed(text)

    handle.inner_test = checked
    try:
        return (yield)
    finally:
        handle.inner_test = inner


def _start(item):
    sanitizer = _new_sanitizer(item)
    _current.append(sanitizer)
    return sanitizer.enable()


def _finish(item, sanitizer) -> tuple:
    """Flushes and disables; returns the report (None without findings)
    and whether findings fail the check."""
    from npu_lifetime.sanitizer import sites

    try:
        with sites.phase("after the test's body (the garbage collector ran before the check)"):
            gc.collect()
        findings = sanitizer.flush()
    finally:
        sanitizer.disable()
        if _current and _current[-1] is sanitizer:
            _current.pop()
    options = getattr(item, _KEY)[0]
    if not options.get("live", False):
        findings = [f for f in findings if not getattr(f, "live", False)]
    if not findings:
        return None, False
    return sanitizer.report(findings), bool(sanitizer.failing(findings))
