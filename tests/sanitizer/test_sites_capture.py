"""The sanitizer's call sites: the native stack walk (_frames.c) and its
pure-Python fallback capture the same frames, and the line numbers worked
out later from instruction offsets are the lines the frames were on."""
import os
import sys

import pytest

from npu_lifetime.sanitizer import native

from npu_lifetime.sanitizer import sites

needs_native = pytest.mark.skipif(
    native.frames is None and (os.environ.get("CI") != "true" or not native.ENABLED),
    reason="npu_lifetime.sanitizer._frames is not built (python setup.py build_ext --inplace)",
)


def _lines_here(capture):
    """A capture, and the line it was taken on (f_lineno, read directly)."""
    here = sys._getframe()
    return capture(8, 0), here.f_lineno


def _two_levels(capture):
    site, line = _lines_here(capture)
    return site, line, sys._getframe().f_lineno - 1


@pytest.fixture(params=["native", "python"])
def walk(request):
    """The stack walk: C's (``Parts.capture``) or Python's (``sites.capture``)."""
    if request.param == "native":
        assert native.frames is not None or (os.environ.get("CI") != "true" or not native.ENABLED), "the native walk is not built"
        if native.frames is None:
            pytest.skip("npu_lifetime.sanitizer._frames is not built")
        return native.native_parts().capture
    return sites.capture


def test_the_captured_lines_are_the_lines_the_frames_were_on(walk):
    site, inner_line, outer_line = _two_levels(walk)
    (code0, line0), (code1, line1) = site.frames[:2]
    assert (code0.co_name, line0) == ("_lines_here", inner_line)
    assert (code1.co_name, line1) == ("_two_levels", outer_line)
    assert site.innermost().endswith(f"test_sites_capture.py:{inner_line} in _lines_here")


def test_depth_bounds_the_user_frames(walk):
    def nest(n):
        return nest(n - 1) if n else walk(3, 0)

    site = nest(10)
    assert [code.co_name for code, _ in site.frames] == ["nest"] * 3


def test_a_capture_keeps_offsets_until_lines_are_asked_for(walk):
    site, _ = _lines_here(walk)
    assert site._frames is None and site.raw_frames  # nothing worked out yet
    assert all(isinstance(offset, int) for _, offset in site.raw_frames)
    assert site.frames and site._frames is site.frames


def _captures(capture):
    def at(depth):
        return capture(depth, 0)

    return [at(1), at(2), at(8)]


@needs_native
def test_native_and_python_walks_agree():
    native_sites = _captures(native.native_parts().capture)
    python = _captures(sites.capture)
    assert all(type(site) is native.CSite for site in native_sites)
    assert all(type(site) is sites.PythonSite for site in python)
    for a, b in zip(native_sites, python):
        assert [c for c, _ in a.raw_frames] == [c for c, _ in b.raw_frames]
        assert [c for c, _ in a.raw_library] == [c for c, _ in b.raw_library]
        # only the test's own frame (third) sits on another line: the line of each _captures() call
        assert a.frames[:2] == b.frames[:2] and a.frames[3:] == b.frames[3:]
        assert [code for code, _ in a.frames] == [code for code, _ in b.frames]


def test_a_phase_names_the_site_without_a_walk(walk):
    with sites.phase("after the script ended"):
        site = walk(8, 0)
    assert site.frames == () and "after the script ended" in site.innermost()


def test_a_thread_without_user_frames_says_so(walk):
    """A capture on a thread that runs no user code (its only frames are
    the standard library's and code compiled from a string) has no frame and
    names the thread, whichever walk took it."""
    import threading

    namespace = {"capture": walk}
    exec(compile("def take(out):\n    out.append(capture(8, 0))\n", "<string>", "exec"), namespace)
    out: list = []
    thread = threading.Thread(target=namespace["take"], args=(out,), name="engine")
    thread.start()
    thread.join()
    (site,) = out
    assert site.frames == () and site.user_frames() == []
    assert site.innermost() == "<no user frame: on thread 'engine', which runs no user code (e.g. autograd's engine)>"
