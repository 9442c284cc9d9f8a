"""Device backends: one code path for CUDA, Ascend NPU and the simulated
device, parameterised by how each names streams, reports events and knows
its allocations.

A backend connects the framework's trace callbacks once per process (they
cannot be unregistered) and sends them to its hub, which delivers them to
every enabled sanitizer of the device.  Stream keys are ``(device_index,
raw handle)``: handle 0, the default stream, exists on every device.
"""
from __future__ import annotations

import operator
import threading
import types
import weakref
from typing import Callable, Optional

import torch

from .. import simdevice
from ..recording import watchers
from .hub import DEVICE_ONLY, KEEP_ARGS, KEY_LAST, Hub


class DeviceUnavailable(RuntimeError):
    """The sanitizer was asked for a device this machine does not have."""


class Backend:
    device_type = ""
    allocations_by_first_sight = False  # no allocator callbacks: see new storages in outputs
    hooks_ops = False  # before_op / inside_op do something (else the dispatch mode skips them)
    stream_handle = None  # or h(device) -> handle with current_stream(device) == (device, h(device))
    # each stream-creation event is one constructor call of the program's, so
    # the line that made it names it (see user_names.Names.note_stream); not so
    # for the trace backends (_TraceBackend)
    creation_is_a_constructor_call = True

    def __init__(self) -> None:
        self.hub = Hub()
        self._connected = False
        self._lock = threading.Lock()

    def connect(self, parts) -> None:
        """Connects the device's callbacks to the hub, once per process,
        with the deliveries of ``parts`` (``native.Parts``: its
        ``event_subscriber`` and ``trace_delivery``; the default parts at
        the first ``enable()``: every sanitizer of the device shares them)."""
        with self._lock:
            if not self._connected:
                self._connect(parts)
                self._connected = True

    def tracks(self, tensor: torch.Tensor) -> bool:
        return tensor.device.type == self.device_type

    def default_stream(self, device_index: int) -> tuple:
        return (device_index, 0)

    def live_blocks(self) -> dict:
        """Address -> allocation stream key of every live block the device's
        allocator holds now (for storages allocated before tracking)."""
        return {}

    def before_op(self) -> None:
        """Called before each op is dispatched (and before its frame opens)."""

    def inside_op(self, func, args: tuple) -> None:
        """Called after an op ran, before its frame closes."""

    def collective_stream(self, group: int, device_index: int) -> Optional[tuple]:
        """Where a collective with no wait inside runs: None for the current
        stream, else a stream of the process group's own."""
        return None

    def describe(self, key: tuple) -> str:
        device, handle = key
        where = f"{self.device_type}:{device}"
        return f"default stream ({where})" if handle == 0 else f"stream {handle:#x} ({where})"

    # per-backend
    def check_available(self) -> None:
        raise NotImplementedError

    def _connect(self, parts) -> None:
        raise NotImplementedError

    def current_stream(self, device_index: int) -> tuple:
        raise NotImplementedError

    def stream_key(self, stream) -> tuple:
        raise NotImplementedError

    def current_device(self) -> int:
        raise NotImplementedError


class _TraceBackend(Backend):
    """CUDA and NPU: torch's (or torch_npu's) GPU trace callbacks."""

    # torch (c10/cuda/CUDAStream.cpp, initSingleStream) and torch_npu fire a
    # creation for every stream of the device's pool when the pool is made,
    # at the first Stream() (on NPU 34 streams, the default stream among
    # them), and none at later Stream() calls: a creation's line says
    # nothing of which stream a call returned; the wrapped constructor
    # says it instead (_patch_stream_constructor)
    creation_is_a_constructor_call = False

    def _register_trace(self, register: Callable, parts) -> None:
        """``register(kind, callback)`` for each trace kind."""
        hub, device = self.hub, self._raw_stream_calls()[0]  # the device: a C call

        def subscriber(name, current_device=None, keying=KEEP_ARGS):
            return parts.event_subscriber(hub, name, current_device, keying)

        register("event_creation", subscriber("on_event_created"))
        register("event_deletion", subscriber("on_event_deleted"))
        register("event_record", subscriber("on_event_record", device, KEY_LAST))
        register("event_wait", subscriber("on_event_wait", device, KEY_LAST))
        allocated, freed = parts.trace_delivery.memory_subscribers(self)
        register("memory_allocation", allocated)
        register("memory_deallocation", freed)
        register("stream_creation", subscriber("on_stream_created", device, KEY_LAST))
        register("device_synchronization", subscriber("on_device_sync", device, DEVICE_ONLY))
        register("stream_synchronization", subscriber("on_stream_sync", device, KEY_LAST))
        register("event_synchronization", subscriber("on_event_sync"))

    def _raw_stream_calls(self) -> tuple:
        """``(current device index (), current stream's raw handle (device))``,
        as C functions: called from C at every allocation."""
        raise NotImplementedError

    def _patch_queries(self, event_class, stream_class, event_handle: Callable) -> None:
        """A query that returned True is a host synchronisation the trace
        does not report; our own pollers opt out (``watchers.internal_polling``)."""
        hub, backend = self.hub, self
        event_query, stream_query = event_class.query, stream_class.query

        def query_event(event):
            done = event_query(event)
            if done and hub.sinks and not watchers.polling_internally():
                hub.event("on_event_sync", event_handle(event))
            return done

        def query_stream(stream):
            done = stream_query(stream)
            if done and hub.sinks and not watchers.polling_internally():
                hub.event("on_stream_sync", backend.stream_key(stream))
            return done

        event_class.query, stream_class.query = query_event, query_stream

    def _patch_stream_constructor(self, stream_class) -> None:
        """Each ``Stream()`` call tells the sinks which stream it returned
        (``on_stream_constructed``), so the line that made it can name it.
        A call with ``stream_id`` wraps a stream that exists (torch_npu's
        ``current_stream()`` makes one each time): it tells nothing, at no
        cost."""
        hub, backend = self.hub, self
        construct = stream_class.__new__

        def __new__(cls, *args, **kwargs):
            stream = construct(cls, *args, **kwargs)
            if hub.sinks and "stream_id" not in kwargs:
                hub.event("on_stream_constructed", backend.stream_key(stream))
            return stream

        stream_class.__new__ = staticmethod(__new__)


class TraceDelivery:
    """The device trace's allocations and frees to the hub's sinks, in
    Python (the reference; ``native.py``'s C one has the same two
    functions, with one C call per allocation or free)."""

    @staticmethod
    def memory_subscribers(backend: _TraceBackend) -> tuple:
        """The allocation and free subscribers of ``backend``'s trace:
        the hub's Python delivery, on the current stream."""
        allocated, freed = backend.hub.direct("on_trace_alloc"), backend.hub.direct("on_trace_free")
        return (lambda ptr: allocated(ptr, backend.current_device())), freed

    @staticmethod
    def shortcut(registry, subscriber) -> None:
        """Lets ``registry`` (torch's callbacks of one trace kind) call
        ``subscriber`` without torch's loop while it is the only one: the
        C delivery's (``_trace_hook.Fire``); in Python, torch's loop stays."""

    @staticmethod
    def install_bridge() -> None:
        """With torch's GPU trace active: torch's trace delivered without
        its import per event (the C++ bridge, ``trace_bridge.py``); in
        Python, torch's own delivery stays."""


def _blocks_from_snapshot(segments, stream_field: str = "stream") -> dict:
    blocks: dict = {}
    for segment in segments:
        stream = int(segment.get(stream_field, 0) or 0)
        device = int(segment.get("device", 0) or 0)
        for block in segment.get("blocks", ()):
            if block.get("state") in ("active_allocated", "live"):
                blocks[int(block["address"])] = (device, stream)
    return blocks


class CudaBackend(_TraceBackend):
    device_type = "cuda"
    # the current stream's handle on a device, a C call (_dispatch.c makes current_stream's key with it)
    stream_handle = staticmethod(getattr(torch._C, "_cuda_getCurrentRawStream", None))

    tracks = staticmethod(operator.attrgetter("is_cuda"))  # called per tensor per op: no Python frame

    def check_available(self) -> None:
        if not torch.cuda.is_available():
            raise DeviceUnavailable(
                "the lifetime sanitizer was asked for 'cuda', but this machine has no CUDA device "
                "(torch.cuda.is_available() is False). Use device 'sim' to check stream code on CPU "
                "tensors with npu_lifetime.simdevice streams."
            )

    def _connect(self, parts) -> None:
        from torch.cuda import _gpu_trace

        torch._C._activate_gpu_trace()
        parts.trace_delivery.install_bridge()  # the same delivery, without torch's import per event
        registered: dict = {}

        def register(kind: str, cb: Callable) -> None:
            getattr(_gpu_trace, f"register_callback_for_{kind}")(cb)
            registered[kind] = cb

        self._register_trace(register, parts)
        for kind, subscriber in registered.items():  # event_record -> EventRecordCallbacks
            registry = getattr(_gpu_trace, "".join(w.capitalize() for w in kind.split("_")) + "Callbacks", None)
            if registry is not None:
                parts.trace_delivery.shortcut(registry, subscriber)
        self._patch_queries(torch.cuda.Event, torch.cuda.Stream, lambda e: e.cuda_event)
        self._patch_stream_constructor(torch.cuda.Stream)

    def current_device(self) -> int:
        return torch._C._cuda_getDevice()  # torch.cuda.current_device() without its Python layers

    def _raw_stream_calls(self) -> tuple:
        return torch._C._cuda_getDevice, self.stream_handle

    def current_stream(self, device_index: int) -> tuple:
        return (device_index, self.stream_handle(device_index))

    def stream_key(self, stream) -> tuple:
        if not isinstance(stream, torch.cuda.Stream):
            stream = torch.cuda.Stream(
                stream_id=stream.stream_id, device_index=stream.device_index, device_type=stream.device_type
            )
        return (stream.device_index, stream.cuda_stream)

    def live_blocks(self) -> dict:
        from ..shim.state import installed

        setup = installed()
        if setup is not None and setup.device == "cuda":
            return _shim_blocks()
        try:
            return _blocks_from_snapshot(torch.cuda.memory._snapshot()["segments"])
        except (RuntimeError, KeyError, TypeError):
            return {}


def _shim_blocks() -> dict:
    from ..shim import api

    blocks: dict = {}
    for segment in api.snapshot().get("segments", ()):
        for block in segment.get("blocks", ()):
            if block.get("state") == "live":
                stream = block.get("alloc_stream", segment.get("stream", 0))
                blocks[int(block["address"])] = (int(segment.get("device", 0)), int(stream))
    return blocks


class NpuBackend(_TraceBackend):
    """torch_npu: its trace API (torch_npu.utils._npu_trace,
    torch_npu._C._activate_npu_trace).  Run against the real torch_npu on a
    stand-in CANN runtime (tests/platforms/npu_standin), not on NPU hardware.

    Trace callbacks fire inside torch_npu's ``_lazy_init`` (the device's
    first streams and events), so nothing here may call into torch.npu's
    Python layer, which would enter ``_lazy_init`` again and hang: the
    device and streams are read from torch_npu._C, and stream handles are
    taken without draining the task queue where the NPU bridge is loaded."""

    device_type = "npu"

    def check_available(self) -> None:
        try:
            import torch_npu  # noqa: F401  (registers torch.npu)
        except ImportError:
            raise DeviceUnavailable(
                "the lifetime sanitizer was asked for 'npu', but torch_npu is not installed; "
                "use device 'sim' on a machine without an NPU"
            ) from None
        if not torch.npu.is_available():
            raise DeviceUnavailable("the lifetime sanitizer was asked for 'npu', but torch_npu sees no NPU")

    def _connect(self, parts) -> None:
        import torch_npu
        import torch_npu.utils._npu_trace as npu_trace

        torch_npu._C._activate_npu_trace(0)  # stream-check mode

        def register(kind: str, cb: Callable) -> None:
            getattr(npu_trace, f"register_callback_for_npu_{kind}")(cb, f"npu_lifetime_{kind}")

        self._register_trace(register, parts)
        device = self._raw_stream_calls()[0]
        register("record_stream", parts.event_subscriber(self.hub, "on_record_stream_ptr", device, KEY_LAST))
        register("erase_stream", parts.event_subscriber(self.hub, "on_erase_stream_ptr", device, KEY_LAST))
        self._patch_queries(torch_npu.npu.Event, torch_npu.npu.Stream, lambda e: e.npu_event)
        for stream_class in (torch_npu.npu.Stream, getattr(torch_npu.npu, "SyncLaunchStream", None)):
            if stream_class is not None:  # SyncLaunchStream is a class of its own, not a Stream
                self._patch_stream_constructor(stream_class)

    def current_device(self) -> int:
        import torch_npu

        return torch_npu._C._npu_getDeviceWithoutSet()

    def _raw_stream_calls(self) -> tuple:
        import torch_npu

        return torch_npu._C._npu_getDeviceWithoutSet, torch_npu._C._npu_getCurrentRawStreamNoWait

    def current_stream(self, device_index: int) -> tuple:
        import torch_npu

        return (device_index, int(torch_npu._C._npu_getCurrentRawStreamNoWait(device_index)))

    def default_stream(self, device_index: int) -> tuple:
        import torch_npu

        stream_id, index, device_type = torch_npu._C._npu_getDefaultStream(device_index)
        return self.stream_key(torch.Stream(stream_id=stream_id, device_index=index, device_type=device_type))

    def stream_key(self, stream) -> tuple:
        from ..shim import npu_queue

        return (stream.device_index, npu_queue.stream_handle(stream))

    def live_blocks(self) -> dict:
        from ..shim.state import installed

        setup = installed()
        if setup is not None and setup.device == "npu":
            return _shim_blocks()
        try:
            return _blocks_from_snapshot(torch.npu.memory_snapshot())
        except (RuntimeError, KeyError, TypeError, AttributeError):
            return {}


class SimBackend(Backend):
    """CPU tensors on the simulated device (``npu_lifetime.simdevice``).
    Host memory has no allocator to ask: a storage first seen as a fresh
    output is allocated on the current stream then; one first seen as an
    input existed before tracking, on the default stream."""

    device_type = "cpu"
    allocations_by_first_sight = True
    hooks_ops = True

    tracks = staticmethod(operator.attrgetter("is_cpu"))

    def check_available(self) -> None:
        return None

    def _connect(self, parts) -> None:
        simdevice.add_listener(sim_listener(self.hub, parts.event_subscriber))
        _patch_storage_moves(self.hub)
        _patch_read_backs(self.hub)
        simdevice.autograd_streams()

    def current_device(self) -> int:
        return simdevice.DEVICE_INDEX

    def current_stream(self, device_index: int) -> tuple:
        return simdevice.current_stream().key

    def stream_key(self, stream) -> tuple:
        if isinstance(stream, simdevice.Stream):
            return stream.key
        return (stream.device_index, stream.stream_id)

    def before_op(self) -> None:
        simdevice.op_starting()

    def inside_op(self, func, args: tuple) -> None:
        simdevice.op_ran(func, args)

    def collective_stream(self, group: int, device_index: int) -> tuple:
        return (device_index, -group - 1)  # gloo runs collectives on threads of its own

    def watch(self, tensor, on_free: Callable[[int, int], None], sid: int) -> None:
        """Calls ``on_free(address, sid)`` when the storage of ``tensor`` (a
        tensor or an untyped storage) dies.  A storage resized in place
        (``untyped_storage().resize_``, ``Tensor.resize_`` to a larger size)
        moves to new memory: it is watched again with the new address and
        storage id, and the old watch then names a storage no longer there."""
        storage = tensor if isinstance(tensor, torch.UntypedStorage) else tensor.untyped_storage()
        weakref.finalize(storage, on_free, storage.data_ptr(), sid)

    def describe(self, key: tuple) -> str:
        handle = key[1]
        if handle < 0:
            return f"sim collective stream of process group {-handle - 1}"
        return "sim default stream" if handle == 0 else f"sim stream {handle}"


def _patch_storage_moves(hub: Hub) -> None:
    """Host-memory storage calls that move a storage to a new block, outside
    the dispatcher, wrapped once per process and reported as
    ``on_storage_resized`` (the old block freed, the new one allocated),
    after ``on_storage_read`` when the old bytes are copied over:

    - ``untyped_storage().resize_(n)`` (FSDP frees parameters with
      ``resize_(0)``): copies when it grows;
    - ``share_memory_()``: copies into shared memory, unless already shared.
    """
    _wrap_move(hub, "resize_", lambda storage, size, *a, **k: size > storage.nbytes())
    _wrap_move(hub, "share_memory_", lambda storage, *a, **k: not storage.is_shared())


def _wrap_move(hub: Hub, name: str, copies) -> None:
    original = getattr(torch.UntypedStorage, name)
    if getattr(original, "_npu_lifetime", False):
        return

    def moving(storage, *args, **kwargs):
        if not hub.sinks or storage.device.type != "cpu":
            return original(storage, *args, **kwargs)
        before = storage.data_ptr()
        if before and copies(storage, *args, **kwargs):
            hub.event("on_storage_read", storage, before)  # the old bytes are copied to the new block
        out = original(storage, *args, **kwargs)
        after = storage.data_ptr()
        if after != before:
            hub.event("on_storage_resized", storage, before, after, bool(before and after))
        return out

    moving._npu_lifetime = True
    moving.__name__ = name
    setattr(torch.UntypedStorage, name, moving)


def _always(tensor, *args, **kwargs) -> bool:
    return True


def _to_the_host(tensor, *args, **kwargs) -> bool:
    """``Tensor.to(...)`` names the host as its device (``.to("cpu")``,
    ``.to(device="cpu")``, ``.to(other_cpu_tensor)``): on a device, a copy to
    the host; ``.to(dtype)`` alone is an op on the device's stream."""
    try:
        device = torch._C._nn._parse_to(*args, **kwargs)[0]
    except (TypeError, RuntimeError):
        return False  # torch's own call will say what is wrong
    return device is not None and device.type == "cpu"


# Tensor methods that copy a device tensor to the host and wait for the copy (CUDA: a blocking copy),
# with when they do; __reduce_ex__ is pickle's and torch.save's (each tensor's storage is copied out)
_READ_BACKS = {"tolist": _always, "cpu": _always, "numpy": _always, "to": _to_the_host, "__reduce_ex__": _always}


def _patch_read_backs(hub: Hub) -> None:
    """The read-backs of ``_READ_BACKS`` on host memory dispatch no op, so
    they are wrapped (once per process, idle without a sanitizer) and
    reported as ``on_host_read``: a read on the current stream, then a host
    wait."""
    for name, applies in _READ_BACKS.items():
        original = getattr(torch.Tensor, name)
        if getattr(original, "_npu_lifetime", False):
            continue

        def read_back(tensor, *args, _original=original, _name=f"Tensor.{name}", _applies=applies, **kwargs):
            if hub.sinks and tensor.is_cpu and _applies(tensor, *args, **kwargs):
                hub.event("on_host_read", tensor, _name)
            return _original(tensor, *args, **kwargs)

        read_back._npu_lifetime = True
        read_back.__name__ = name
        read_back.__doc__ = original.__doc__
        setattr(torch.Tensor, name, read_back)


_SIM_EVENTS = ("on_stream_created", "on_event_created", "on_event_deleted", "on_event_record",
               "on_event_wait", "on_event_sync", "on_stream_sync", "on_device_sync", "record_stream")


class _SimListener(types.SimpleNamespace):
    """The simulated device's listener: each of its notifications becomes a
    device event of the simulated backend's hub, delivered by its
    subscriber (an attribute per notification, ``sim_listener``)."""


def sim_listener(hub: Hub, event_subscriber: Callable) -> _SimListener:
    """The listener whose subscribers are ``event_subscriber(hub, name,
    device, keying)``'s (``Parts.event_subscriber``)."""
    return _SimListener(**{name: event_subscriber(hub, name, None, KEEP_ARGS) for name in _SIM_EVENTS})


_BACKENDS: dict = {}
_CLASSES = {"cuda": CudaBackend, "npu": NpuBackend, "sim": SimBackend, "cpu": SimBackend}


def backend_for(device: str) -> Backend:
    if device not in _CLASSES:
        raise ValueError(f"device must be one of cuda, npu, sim; not {device!r}")
    cls = _CLASSES[device]
    if cls not in _BACKENDS:
        _BACKENDS[cls] = cls()
    return _BACKENDS[cls]


def backends() -> tuple:
    """The backends made so far."""
    return tuple(_BACKENDS.values())


