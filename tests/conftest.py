import ctypes
import shutil
import subprocess
import time

import pytest

from npu_lifetime import shim

S1, S2, S3 = 0x1000, 0x2000, 0x3000  # simulated stream handles


@pytest.fixture
def sim_shim():
    """The shim on the simulated runtime, empty, poll policy."""
    shim.reset()
    shim.select_runtime("sim")
    shim.set_policy("poll")
    shim.sim.set_memory_limit(0)
    yield shim
    shim.reset()
    shim.sim.set_memory_limit(0)
    shim.set_policy("poll")


def compile_c(tmp_path_factory, source: str, name: str, *flags: str):
    """allocator_shim/tests/SOURCE built warning-free with the system C
    compiler (the test skips without one); returns the output's path."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    out = tmp_path_factory.mktemp(name) / name
    libraries = [f for f in flags if f.startswith("-l")]  # after the source, for --as-needed linkers
    options = [f for f in flags if not f.startswith("-l")]
    subprocess.run([cc, "-std=c11", "-Wall", "-Wextra", "-Werror", *options, f"allocator_shim/tests/{source}",
                    "-o", str(out), *libraries], check=True)
    return out


@pytest.fixture(scope="session")
def fake_acl_library(tmp_path_factory):
    """allocator_shim/tests/fake_ascendcl.c as a shared library."""
    out = compile_c(tmp_path_factory, "fake_ascendcl.c", "libfake_ascendcl.so", "-shared", "-fPIC",
                    "-fvisibility=hidden", "-lpthread")
    lib = ctypes.CDLL(str(out))
    lib.fake_acl_calls.restype = ctypes.c_uint64
    lib.fake_acl_calls.argtypes = [ctypes.c_char_p]
    lib.fake_acl_complete.argtypes = [ctypes.c_void_p]
    lib.fake_acl_set_capturing.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.fake_acl_set_memory_limit.argtypes = [ctypes.c_uint64]
    lib.fake_acl_in_use.restype = ctypes.c_uint64
    lib.fake_acl_launch.argtypes = [ctypes.c_void_p]
    lib.fake_acl_kernels_pending.argtypes = [ctypes.c_void_p]
    lib.fake_acl_kernels_pending.restype = ctypes.c_uint64
    lib.fake_npu_stream_handle.argtypes = [ctypes.c_void_p]
    lib.fake_npu_stream_handle.restype = ctypes.c_void_p
    return out, lib


@pytest.fixture
def acl_shim(fake_acl_library):
    path, lib = fake_acl_library
    shim.reset()
    shim.select_runtime("acl", str(path))
    shim.set_policy("poll")
    lib.fake_acl_set_task_queue(0)
    lib.fake_acl_reset_counters()
    yield lib
    lib.fake_acl_set_task_queue(0)
    shim.reset()
    shim.select_runtime("sim")


def wait_for(condition, timeout: float = 5.0) -> bool:
    """Polls ``condition()`` every 2 ms for up to ``timeout`` seconds (a
    background thread's work, e.g. the record_use reaper's); its last answer."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if condition():
            return True
        time.sleep(0.002)
    return condition()


def python_everywhere(monkeypatch) -> None:
    """The pure-Python sanitizer for what follows: sanitizers built without
    ``parts`` get ``native.python_parts()`` while ``monkeypatch`` lasts (a
    device backend's deliveries are made at its first connection, once per
    process: tests/sanitizer/test_event_hook.py compares its two paths)."""
    from npu_lifetime.sanitizer import native

    monkeypatch.setattr(native, "_default", native.python_parts())


@pytest.fixture(params=["native", "python"])
def both_ways(request, monkeypatch):
    """One test body, two instances (as CPython's tests do with
    ``import_fresh_module``): the test runs with the sanitizer's C parts,
    then with its pure-Python reference (record_use's and the shim hooks'
    too), in this process.  A suite takes it with
    ``pytestmark = pytest.mark.usefixtures("both_ways")``."""
    from npu_lifetime.sanitizer import native

    if request.param == "native":
        if native.default().name != "native" or native.dispatch is None:
            pytest.skip("the sanitizer's native parts are off or not built: the python instance is the test")
    else:
        python_everywhere(monkeypatch)
        python_record_use_and_hooks(request)
    return request.param


# -- one test body, two instances, beyond the sanitizer --------------------------------------------
def python_record_use_and_hooks(request) -> None:
    """record_use's Python entry paths and table, and the shim hooks' ctypes
    callbacks, for the rest of the test (their one switch each)."""
    from npu_lifetime import recording
    from npu_lifetime.shim import hooks

    recording.use_native(False)
    hooks.use_relay(False)
    request.addfinalizer(lambda: (recording.use_native(True), hooks.use_relay(True)))


def switched_instance(request, available: bool, parts: str, use_native) -> str:
    """The instance ``request.param`` of a suite whose C parts have one
    switch, ``use_native(bool)``: the native instance skips where they are
    not ``available``; the python one turns them off for the test."""
    if request.param == "native":
        if not available:
            pytest.skip(f"{parts} are off or not built: the python instance is the test")
    else:
        use_native(False)
        request.addfinalizer(lambda: use_native(True))
    return request.param


@pytest.fixture(params=["native", "python"])
def record_both_ways(request):
    """record_use's suites, one body two instances: its C parts (``_entry.c``'s
    entry and fast paths, ``_holds.cpp``'s table), then their Python
    references, chosen by recording's one switch (``recording.use_native``)
    before the test makes its routes and fallbacks."""
    from npu_lifetime import recording

    return switched_instance(request, recording.native_available(), "record_use's C parts", recording.use_native)


@pytest.fixture(params=["native", "python"])
def hooks_both_ways(request):
    """The shim's hooks, one body two instances: ``_hook_relay.c``, then
    hooks.py's ctypes callbacks (``hooks.use_relay``: the hooks are set again)."""
    from npu_lifetime import native_parts
    from npu_lifetime.shim import hooks

    relay = native_parts.load("npu_lifetime.shim._hook_relay") is not None
    return switched_instance(request, relay, "the shim's hook relay", hooks.use_relay)


@pytest.fixture(params=["native", "python"])
def model_both_ways(request, monkeypatch):
    """The lifetime model's suites, one body two instances: the C++ model
    (``native_model.cpp``), then ``model.py``'s.  The class under test: a
    test makes its models from it, and the schedule helpers
    (helpers/schedule_helpers.py) run it.  The native instance fails a test
    that made no native model (it would test Python twice)."""
    from helpers import schedule_helpers
    from npu_lifetime import lifetime

    if request.param == "python":
        model_class = lifetime.LifetimeModel
    elif lifetime.NativeLifetimeModel is None:
        pytest.skip("the native lifetime model is off or not built: the python instance is the test")
    else:
        class model_class(lifetime.NativeLifetimeModel):  # noqa: N801 - counts what the test made
            made = 0

            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                type(self).made += 1

    monkeypatch.setattr(schedule_helpers, "MODEL", model_class)
    yield model_class
    if request.param == "native":
        assert model_class.made > 0, f"{request.node.name} made no native model"
