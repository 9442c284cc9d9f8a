"""``record_use(tensor, stream=None)``: precise cross-stream lifetime.

An event is recorded on ``stream`` (default: the current stream) at the
call; the tensor's memory is not reused until it has fired.  It covers what
is queued on ``stream`` up to the call (and what that is ordered after), not
later work.  A no-op on the tensor's allocation stream; repeated calls on one
stream keep one live event (a stream runs in order: the later one subsumes).

Where a call goes, cheapest first:

1. **Fast path**: no dispatch mode is active in this thread (so no
   sanitizer could see an op) and nothing is being compiled.  With the shim
   installed for the tensor's device, the storage's address and the raw
   stream handle go to ``npl_record_use`` in one ctypes call
   (``_ShimRoute.fast``); without it, straight to ``NativeFallback.record``
   (``_fallback_fast``).  Every check that would cost time in the common
   case is left to the failure branch.
2. **The custom op** ``npu_lifetime::record_use(Tensor, int stream_id, int
   device_index, int device_type)`` when a sanitizer watches the device (its
   dispatch mode sees the op) or torch.compile traces the call (the op is
   side-effectful, so compilers keep it).  A simulated stream travels as
   ``(handle, 0, cpu)``.
3. **The kernel** (``_apply``): the shim route of the device if there is
   one; else, for cuda/npu, ``NativeFallback`` (event + owned reference
   under the native caching allocator, ``torch_allocator_fallback.py``); on the
   simulated device there is nothing to hold.
"""
from __future__ import annotations

import contextlib
import ctypes
import operator
from typing import Callable, Optional

import torch

from .. import native_parts, simdevice, storage_holders
from ..shim import api as shim_api
from ..shim import state as shim_state
from ..shim.install import stream_handle
from ..shim.state import installed
from ..shim.streams import device_stream
from . import traced_entry, watchers
from .torch_allocator_fallback import FALLBACK

# record_use's entry and fast paths in C (_entry.c), or None: the Python ones here
_BUILT_ENTRY = native_parts.load("npu_lifetime.recording._entry")
_entry = _BUILT_ENTRY  # what the fast paths made from now on are made of (use_native_entry)
DEVICE_TYPES = ("cuda", "npu")
_CPU = 0  # c10::DeviceType::CPU, how a simulated stream travels through the op
_is_compiling = torch.compiler.is_compiling
_watching = watchers.watching
# Dispatch modes (a sanitizer's, FakeTensorMode, ...) live on a thread-local
# stack: with none in this thread no mode could see the op, so the fast path
# may skip it.  42 ns here, where asking the sanitizers costs 240 ns.
_dispatch_modes = torch._C._len_torch_dispatch_stack


class RecordUseError(ValueError):
    pass


# -- public calls -----------------------------------------------------------------------
def record_use_reference(tensor: torch.Tensor, stream=None) -> None:
    """Keeps ``tensor``'s memory from being reused until the work queued on
    ``stream`` (default: the current stream) so far has finished.  The
    pure-Python entry: ``record_use`` is the C one (``_entry.c``) where it
    is built, this otherwise; every call the C entry does not finish itself
    comes here."""
    fast = _fast
    if fast is not None and fast(tensor, stream):
        return
    _record_use_checked(tensor, stream)


def record_stream(tensor: torch.Tensor, stream) -> None:
    """``tensor.record_stream(stream)``, also for simdevice streams.  A tensor
    without memory (no elements) needs nothing; a freed storage is refused."""
    _check_tensor("record_stream", tensor)
    if isinstance(stream, simdevice.Stream):
        _simulated_tensor(tensor)
        if _memory_of("record_stream", tensor):
            watchers.notify("record_stream", tensor, stream)
        return
    typed = _stream_for("record_stream", tensor, stream, required=True)
    if _memory_of("record_stream", tensor):
        tensor.record_stream(typed)


def erase_stream(tensor: torch.Tensor, stream) -> None:
    """Withdraws an earlier ``record_stream(stream)`` (torch_npu's eraseStream):
    the free no longer waits for ``stream``.  Supported under the shim and on
    the simulated device; the native caching allocators keep no handle for it."""
    _check_tensor("erase_stream", tensor)
    if isinstance(stream, simdevice.Stream):
        _simulated_tensor(tensor)
        if _memory_of("erase_stream", tensor):
            watchers.notify("erase_stream", tensor, stream)
        return
    if tensor.device.type == "cpu":
        raise RecordUseError(
            f"erase_stream on a CPU tensor takes a simdevice stream (npu_lifetime.simdevice), not {stream!r}; "
            "a device stream needs the shim (npu_lifetime.install) and a cuda or npu tensor"
        )
    if tensor.device.type not in DEVICE_TYPES:
        raise RecordUseError(f"erase_stream needs a cuda or npu tensor (or a CPU tensor with a simdevice stream); "
                             f"this one is on {tensor.device}")
    setup = installed()
    if setup is None or setup.device != tensor.device.type:
        raise RecordUseError(
            f"erase_stream needs the shim installed for {tensor.device.type} (npu_lifetime.install"
            f"({tensor.device.type!r}) before any {tensor.device.type} memory is used): the native caching "
            "allocators cannot withdraw a recorded stream"
        )
    typed = _stream_for("erase_stream", tensor, stream, required=True)
    ptr = _memory_of("erase_stream", tensor)
    if not ptr:
        return
    if not shim_api.erase_stream(ptr, stream_handle(typed)):
        raise _shim_refused(tensor, ptr, "erase_stream")
    watchers.notify("erase_stream", tensor, typed)


def _check_tensor(call: str, tensor) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise RecordUseError(f"{call} needs a tensor, not {type(tensor).__name__}")


def _memory_of(call: str, tensor: torch.Tensor) -> int:
    """The storage's address; 0 for a tensor with no elements (nothing to
    keep); RecordUseError for a freed storage or a tensor without one."""
    try:
        storage = tensor.untyped_storage()
    except (NotImplementedError, RuntimeError) as err:
        raise RecordUseError(
            f"{call} needs a strided tensor with a storage, not a {tensor.layout} one ({err}): call it on the "
            "tensors that hold its memory (e.g. a sparse tensor's values() and indices())"
        ) from None
    if storage.nbytes() and storage.data_ptr():
        return storage.data_ptr()
    if tensor.numel() == 0:
        return 0
    raise RecordUseError(
        f"{call} on a freed storage (its memory was already released, e.g. by untyped_storage().resize_(0)): "
        "call it before the storage is freed"
    )


# -- the checked path ---------------------------------------------------------------------
def _record_use_checked(tensor, stream) -> None:
    if _is_compiling():
        _record_use_traced(tensor, stream)
        return
    _check_tensor("record_use", tensor)
    held = storage_holders.other_holders(tensor)  # sparse, nested, functorch-wrapped: the tensors holding its memory
    if held:
        for part in held:
            _record_use_checked(part, stream)
        return
    stream = _stream_for("record_use", tensor, stream)
    if not _memory_of("record_use", tensor):
        return  # no elements: no memory to keep
    device_type = tensor.device.type
    _enable_fast_path_if_installed(device_type)
    if _watching(device_type):
        _OP(tensor, *_op_stream_args(stream))  # the sanitizer's dispatch mode sees the op
    else:
        _apply(tensor, stream)


def _record_use_traced(tensor, stream) -> None:
    """Under torch.compile: only what dynamo can follow.  A missing stream is
    the current one at trace time; dynamo guards on it, so a call under
    another current stream recompiles."""
    if stream is None:
        stream = simdevice.current_stream() if tensor.device.type == "cpu" else _device_module(
            tensor.device.type).current_stream(tensor.device)
    _OP(tensor, *_op_stream_args(stream))


def _stream_for(call: str, tensor: torch.Tensor, stream, required: bool = False):
    """The typed stream for ``tensor`` (a simdevice.Stream for CPU tensors,
    torch.cuda / torch_npu streams otherwise), or a clear error.  ``None``
    is the current stream unless the call ``required`` one."""
    if stream is None and required:
        raise RecordUseError(f"{call} needs a stream (the stream that uses the tensor), not None")
    if tensor.device.type == "cpu":
        return _simulated_stream(call, stream)
    return _device_stream(call, tensor, stream)


def _simulated_stream(call: str, stream):
    if stream is None:
        return simdevice.current_stream()
    if not isinstance(stream, simdevice.Stream):
        raise RecordUseError(
            f"a CPU tensor takes a simdevice stream (npu_lifetime.simdevice), not {stream!r}; "
            f"for a device stream, {call} a cuda or npu tensor"
        )
    return stream


def _device_stream(call: str, tensor: torch.Tensor, stream):
    device = tensor.device
    if isinstance(stream, simdevice.Stream):
        raise RecordUseError(f"a simdevice stream goes with CPU tensors, not a tensor on {device}")
    if device.type not in DEVICE_TYPES:
        raise RecordUseError(
            f"{call} needs a cuda or npu tensor (or a CPU tensor with a simdevice stream); this one is on {device}"
        )
    if stream is None:
        return _device_module(device.type).current_stream(device)
    if not isinstance(stream, torch.Stream):
        raise RecordUseError(f"{call} needs a stream (e.g. torch.{device.type}.Stream()), not {stream!r}")
    if stream.device != device:
        raise RecordUseError(f"stream {stream} is on {stream.device}, the tensor on {device}: use a stream of {device}")
    return _typed_stream(device.type, stream)


def _typed_stream(device_type: str, stream):
    # on the type: torch_npu's Stream.npu_stream property drains its task queue
    if hasattr(type(stream), "cuda_stream") or hasattr(type(stream), "npu_stream"):
        return stream
    return device_stream(device_type, stream)


def _device_module(device_type: str):
    if device_type == "cuda":
        return torch.cuda
    if device_type != "npu":
        raise RecordUseError(f"record_use has no streams for {device_type} tensors")
    try:
        import torch_npu  # noqa: F401  (registers torch.npu)
    except ImportError as err:
        raise RecordUseError("record_use on an npu tensor needs torch_npu, which is not installed") from err
    return torch.npu


def _simulated_tensor(tensor) -> None:
    if not isinstance(tensor, torch.Tensor) or tensor.device.type != "cpu":
        where = getattr(tensor, "device", type(tensor).__name__)
        raise RecordUseError(f"a simdevice stream goes with CPU tensors, not {where}")


# -- the op and its kernel ------------------------------------------------------------------
def _op_stream_args(stream) -> tuple:
    if isinstance(stream, simdevice.Stream):
        return stream.handle, stream.device_index, _CPU
    return stream.stream_id, stream.device_index, stream.device_type


def stream_from_op_args(stream_id: int, device_index: int, device_type: int):
    """The stream ``npu_lifetime::record_use``'s arguments name (a simdevice
    stream for the CPU device type)."""
    if device_type == _CPU:
        return simdevice.Stream(_handle=stream_id)
    return torch.Stream(stream_id=stream_id, device_index=device_index, device_type=device_type)


def _apply(tensor: torch.Tensor, stream) -> None:
    """The op's kernel: the device's shim route, else the torch-allocator fallback."""
    device_type = tensor.device.type
    if device_type in DEVICE_TYPES:
        stream = _typed_stream(device_type, stream)
    route = _routes.get(device_type) or _installed_route(device_type)
    if route is not None:
        route.record(tensor, stream)
    elif device_type in DEVICE_TYPES:
        FALLBACK.record(tensor, stream)
    # simulated device without a shim route: host memory has no stream to outlive


@torch.library.custom_op("npu_lifetime::record_use", mutates_args=())
def _record_use_kernel(tensor: torch.Tensor, stream_id: int, device_index: int, device_type: int) -> None:
    _apply(tensor, stream_from_op_args(stream_id, device_index, device_type))


@_record_use_kernel.register_fake
def _(tensor, stream_id, device_index, device_type) -> None:
    return None


_OP = torch.ops.npu_lifetime.record_use.default
# It returns nothing and mutates nothing: keep compilers from dropping it.
from torch.fx.node import has_side_effect  # noqa: E402

has_side_effect(_OP)


def record_use_op():
    """``torch.ops.npu_lifetime.record_use.default``."""
    return _OP


# -- shim routes and the fast path ----------------------------------------------------------------
class _ShimRoute:
    """How record_use reaches the shim for one device type: the raw handle
    of a typed stream, the raw current stream, and a fast path that skips
    every check the common case does not need."""

    def __init__(self, device_type: str, stream_type: type, handle: Callable, current_handle: Callable,
                 device_flag: str, device_index: Callable, handle_attr: Optional[str] = None,
                 native_device_type: Optional[str] = None, native_handle: Optional[int] = None) -> None:
        self.device_type = device_type
        self.stream_type = stream_type
        self.handle = handle  # typed stream -> raw handle
        self.handle_attr = handle_attr  # the attribute ``handle`` reads, if it reads one (the C path reads it itself)
        # for the C path where the flag or the handle is Python (torch_npu): the device type it
        # compares tensor.device.type with, and the address of a C (stream_id, device_index, device_type) -> handle
        self.native_device_type, self.native_handle = native_device_type, native_handle
        self.current_handle = current_handle  # tensor -> raw handle of its device's current stream
        self.device_flag = device_flag  # the tensor property that is True on this device ("is_cuda", ...)
        self.device_index = device_index  # tensor -> the device index its streams carry
        self.fast = self._make_fast()

    def record(self, tensor: torch.Tensor, stream) -> None:
        ptr = tensor.untyped_storage().data_ptr()
        if _npl_record_use()(ptr, self.handle(stream)) != 0:
            raise _shim_refused(tensor, ptr)

    def _make_fast(self) -> Callable:
        """The C fast path (``_entry.ShimFast``) where it is built, else
        the Python one; the two do the same."""
        if _entry is None:
            return self.make_fast_reference()
        return _entry.ShimFast(
            ctypes.cast(_npl_record_use(), ctypes.c_void_p).value, self.stream_type,
            self.handle_attr or self.handle, self.current_handle, self.device_flag, self.device_index,
            _shim_refused, _dispatch_modes, device_type=self.native_device_type, stream_handle=self.native_handle,
        )

    def make_fast_reference(self) -> Callable:
        npl_record_use = _npl_record_use()
        stream_type, handle_of, current_handle = self.stream_type, self.handle, self.current_handle
        device_flag, device_index = self.device_flag, self.device_index

        def fast(tensor, stream) -> bool:
            """True when done; False sends the call down the checked path,
            which says what was wrong."""
            try:
                if not getattr(tensor, device_flag) or _is_compiling() or _dispatch_modes():
                    return False
                if stream is None:
                    handle = current_handle(tensor)
                elif type(stream) is stream_type and stream.device_index == device_index(tensor):
                    handle = handle_of(stream)
                else:
                    return False
                ptr = tensor.untyped_storage().data_ptr()
            except (AttributeError, TypeError):  # not a tensor or not a stream
                return False
            if not ptr:  # a freed storage
                return False
            if npl_record_use(ptr, handle) != 0:
                raise _shim_refused(tensor, ptr)
            return True

        return fast


def _npl_record_use():
    return shim_api.library().npl_record_use


def _shim_refused(tensor: torch.Tensor, ptr: int, call: str = "record_use") -> RecordUseError:
    if ptr == 0:
        return RecordUseError(
            f"{call} on a freed storage (its memory was already released, e.g. by untyped_storage().resize_(0)): "
            "call it before the storage is freed"
        )
    return RecordUseError(
        f"the shim does not know the storage at {ptr:#x} ({tensor.device}): it was allocated before "
        "npu_lifetime.install() or by another allocator; see npu_lifetime.shim.findings()"
    )


def _cuda_route() -> _ShimRoute:
    return _ShimRoute(
        "cuda", torch.cuda.Stream, handle=operator.attrgetter("cuda_stream"), handle_attr="cuda_stream",
        current_handle=lambda t, raw=torch._C._cuda_getCurrentRawStream: raw(t.get_device()),
        device_flag="is_cuda", device_index=torch.Tensor.get_device,
    )


def _npu_route() -> _ShimRoute:
    """Run against the real torch_npu on a stand-in CANN runtime
    (tests/platforms/npu_standin); not on NPU hardware.  Streams become aclrtStreams
    through the NPU bridge, without draining torch_npu's task queue."""
    import torch_npu

    from ..shim import npu_queue

    bridge = npu_queue._bridge  # the NPU bridge's handle call, for the C path (a Python frame and ctypes here)
    return _ShimRoute(
        "npu", torch_npu.npu.Stream, handle=npu_queue.stream_handle,
        current_handle=lambda t: npu_queue.stream_handle(torch.npu.current_stream(t.device)),
        device_flag="is_npu", device_index=torch.Tensor.get_device,  # is_npu: torch_npu's tensor property (Python)
        native_device_type="npu",
        native_handle=None if bridge is None else ctypes.cast(bridge.npl_npu_stream_handle, ctypes.c_void_p).value,
    )


def simulated_route(handle: Callable[[simdevice.Stream], int]) -> _ShimRoute:
    """The shim on its simulated runtime for CPU tensors whose memory the
    shim handed out (the hand-off harness's buffers); ``handle`` maps a
    simdevice stream to the runtime's handle."""
    return _ShimRoute(
        "cpu", simdevice.Stream, handle=handle, current_handle=lambda t: handle(simdevice.current_stream()),
        device_flag="is_cpu", device_index=lambda t: simdevice.DEVICE_INDEX,
    )


_routes: dict = {}  # device type -> _ShimRoute
_fast: Optional[Callable] = None  # the fast path of the one active route


def _installed_route(device_type: str) -> Optional[_ShimRoute]:
    setup = installed()
    if setup is None or setup.device != device_type:
        return None
    route = _routes[device_type] = _cuda_route() if device_type == "cuda" else _npu_route()
    return route


def use_native_entry(native: bool) -> None:
    """The fast paths made from now on: C (``_entry.c``, where built) or
    their Python references; the routes and the active fast path are
    dropped, so the next call makes them so (the both-ways tests' switch).
    ``record_use`` stays what it was bound to: the C entry hands every call
    to ``record_use_reference`` while a Python fast path is active."""
    global _entry, _fast
    _entry = _BUILT_ENTRY if native else None
    _routes.clear()
    _fast = None


def _enable_fast_path_if_installed(device_type: str) -> None:
    """The shim's fast path for the device if the shim is installed for it,
    else the torch-allocator fallback's (replaced once the shim is installed)."""
    global _fast
    if (_fast is None or getattr(_fast, "fallback", False)) and device_type in DEVICE_TYPES:
        route = _routes.get(device_type) or _installed_route(device_type)
        if route is not None:
            _fast = route.fast
        elif _fast is None:
            _fast = _fallback_fast(device_type)


def _fallback_fast(device_type: str) -> Callable:
    """record_use under the native caching allocator with the checks the
    common case does not need left to the checked path (False sends the
    call there): the fallback's native ``fast`` for the device type."""
    table_fast = FALLBACK.for_device(device_type).fast
    if device_type == "cuda":
        return fallback_fast_path(table_fast, "is_cuda", torch.cuda.current_stream)
    import torch_npu  # noqa: F401  (registers torch.npu)

    return fallback_fast_path(table_fast, "is_npu", torch.npu.current_stream)


# The fast path's compile check: dynamo folds it to True as it does
# torch.compiler.is_compiling, which is two Python calls (is_scripting
# first).  What is_compiling adds, tracing under make_fx (non-strict
# export), runs under a dispatch mode, which the fast path checks next.
_is_dynamo_compiling = getattr(torch.compiler, "is_dynamo_compiling", _is_compiling)


def fallback_fast_path(table_fast: Callable, device_flag: str, current_stream: Callable) -> Callable:
    """The fast path to a fallback's native ``table_fast(tensor, stream)``:
    not compiling, no dispatch mode, no shim installed since, the current
    stream for None (``current_stream(device)``); ``table_fast`` then checks
    a tensor of the device (``device_flag``), a typed stream of its device
    and memory to keep, and records (one C call).  The C one
    (``_entry.FallbackFast``) where it is built, else the Python one."""
    if _entry is not None:
        return _entry.FallbackFast(table_fast, device_flag, current_stream, _dispatch_modes, shim_state)
    return fallback_fast_path_reference(table_fast, device_flag, current_stream)


def fallback_fast_path_reference(table_fast: Callable, device_flag: str, current_stream: Callable) -> Callable:
    def fast(tensor, stream) -> bool:
        if _is_dynamo_compiling() or _dispatch_modes() or shim_state._installed is not None:
            return False
        if stream is None:
            try:
                if not getattr(tensor, device_flag):
                    return False
                stream = current_stream(tensor.device)
            except (AttributeError, TypeError):  # not a tensor
                return False
        return table_fast(tensor, stream)

    fast.fallback = True
    return fast


@contextlib.contextmanager
def shim_route(route: _ShimRoute):
    """Sends record_use calls for ``route.device_type`` to the shim inside
    the block (for the simulated device, whose tensors are not the shim's
    unless a harness allocated them there)."""
    global _fast
    previous_route, previous_fast = _routes.get(route.device_type), _fast
    _routes[route.device_type], _fast = route, route.fast
    try:
        yield route
    finally:
        _fast = previous_fast
        if previous_route is None:
            _routes.pop(route.device_type, None)
        else:
            _routes[route.device_type] = previous_route


# -- the entry: C where built ---------------------------------------------------------------------
def _record_use_polyfill(tensor, stream=None) -> None:
    """What dynamo traces in place of the C entry (it cannot trace C): the
    checked path, which under compilation emits the custom op."""
    _record_use_checked(tensor, stream)


if _BUILT_ENTRY is not None:
    _BUILT_ENTRY.configure(globals(), record_use_reference)
    record_use = _BUILT_ENTRY.record_use
    traced_entry.substitute_when_traced(record_use, _record_use_polyfill)
else:
    record_use = record_use_reference


# -- Tensor.record_use (opt-in) -------------------------------------------------------------------
# A Python function (one frame over the C entry): dynamo traces it and then
# the entry's polyfill.  A method descriptor of torch.Tensor would save the
# frame, but dynamo takes a Tensor method for one of torch's and cannot
# trace it (test_record_use_entry.py).
def _tensor_record_use(self: torch.Tensor, stream=None) -> None:
    """Keeps this tensor's memory from reuse until the work queued on
    ``stream`` (default: the current stream) so far has finished
    (npu_lifetime.record_use)."""
    record_use(self, stream)


def install_tensor_method() -> None:
    """Adds ``Tensor.record_use(stream=None)`` as the RFC proposes it.
    Opt-in, and never over a ``record_use`` that torch (or anyone else)
    already defines: that one is left in place and this raises."""
    existing = getattr(torch.Tensor, "record_use", None)
    if existing is _tensor_record_use:
        return
    if existing is not None:
        raise RecordUseError(
            f"torch.Tensor.record_use already exists ({getattr(existing, '__qualname__', existing)!s}, "
            f"torch {torch.__version__}); npu_lifetime leaves it in place: call it, or npu_lifetime.record_use(t, s)"
        )
    torch.Tensor.record_use = _tensor_record_use


def uninstall_tensor_method() -> None:
    """Removes what ``install_tensor_method`` added (and nothing else)."""
    if getattr(torch.Tensor, "record_use", None) is _tensor_record_use:
        del torch.Tensor.record_use

