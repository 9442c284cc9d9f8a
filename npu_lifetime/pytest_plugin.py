"""pytest plugin: ``@pytest.mark.lifetime_sanitizer`` or the
``lifetime_sanitizer`` fixture runs a test under the lifetime sanitizer and
fails it with the report when there are findings.

    @pytest.mark.lifetime_sanitizer(device="cuda", live=False)
    def test_handoff(): ...

    def test_other(lifetime_sanitizer):   # the sanitizer itself, to inspect
        ...

``live=True`` also fails on storages still alive whose cross-stream uses a
free would leave uncovered.
"""
from __future__ import annotations

import gc

import pytest

_KEY = "_npu_lifetime_sanitizer"


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers",
        "lifetime_sanitizer(device='auto', live=False): run the test under the npu_lifetime "
        "sanitizer; findings fail it",
    )


def _options(item) -> dict:
    marker = item.get_closest_marker("lifetime_sanitizer")
    return dict(marker.kwargs) if marker else {}


def _start(item):
    from npu_lifetime.sanitizer import LifetimeSanitizer
    from npu_lifetime.sanitizer.runner import resolve_device

    sanitizer = getattr(item, _KEY, None)
    if sanitizer is None:
        device = resolve_device(_options(item).get("device", "auto"))
        sanitizer = LifetimeSanitizer(device, on_race="collect", warn_on_free=False)
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
    finally:
        gc.collect()
        findings = sanitizer.flush()
        sanitizer.disable()
    if not _options(item).get("live", False):
        findings = [f for f in findings if not getattr(f, "live", False)]
    if findings:
        pytest.fail(sanitizer.report(findings), pytrace=False)
    return result
