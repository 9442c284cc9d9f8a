"""pytest plugin: ``@pytest.mark.lifetime_sanitizer`` or the
``lifetime_sanitizer`` fixture runs a test under the lifetime sanitizer and
fails it with the report when findings fail the check.

    @pytest.mark.lifetime_sanitizer(device="cuda", live=False, strict=False)
    def test_handoff(): ...

    def test_other(lifetime_sanitizer):   # the sanitizer itself, to inspect
        ...

By default the findings that fail a test are races, reuse races, uncovered
frees a reuse race followed, and invalid frees; ``strict=True`` fails on
every contract violation (latent uncovered frees too, and with ``live=True``
the uses of storages still alive that a free would leave uncovered).  The
report is attached to the test's output in every case, so a test that also
fails for another reason (an assertion) keeps its lifetime findings.
"""
from __future__ import annotations

import gc

import pytest

_KEY = "_npu_lifetime_sanitizer"


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers",
        "lifetime_sanitizer(device='auto', live=False, strict=False): run the test under the npu_lifetime "
        "sanitizer; findings that fail the check fail the test",
    )


def _options(item) -> dict:
    marker = item.get_closest_marker("lifetime_sanitizer")
    return dict(marker.kwargs) if marker else {}


def _start(item):
    from npu_lifetime.sanitizer import LifetimeSanitizer
    from npu_lifetime.sanitizer.runner import resolve_device

    sanitizer = getattr(item, _KEY, None)
    if sanitizer is None:
        options = _options(item)
        device = resolve_device(options.get("device", "auto"))
        sanitizer = LifetimeSanitizer(device, on_race="collect", warn_on_free=False,
                                      strict=bool(options.get("strict", False)))
        setattr(item, _KEY, sanitizer)
    return sanitizer.enable()


@pytest.fixture
def lifetime_sanitizer(request):
    """The sanitizer the test runs under (enabled for the test's body)."""
    sanitizer = _start(request.node)
    yield sanitizer
    sanitizer.disable()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    wanted = item.get_closest_marker("lifetime_sanitizer") is not None or hasattr(item, _KEY)
    if not wanted:
        return (yield)
    sanitizer = _start(item)
    try:
        result = yield
    except BaseException:
        _finish(item, sanitizer)  # the test's own error stays the failure; the findings go with it
        raise
    text = _finish(item, sanitizer)
    if text is not None:
        pytest.fail(text, pytrace=False)
    return result


def _finish(item, sanitizer):
    """Flushes and disables; attaches the report to the test's output and
    returns it when findings fail the check."""
    gc.collect()
    findings = sanitizer.flush()
    sanitizer.disable()
    if not _options(item).get("live", False):
        findings = [f for f in findings if not getattr(f, "live", False)]
    if not findings:
        return None
    text = sanitizer.report(findings)
    item.add_report_section("call", "npu_lifetime", text)
    return text if sanitizer.failing(findings) else None
