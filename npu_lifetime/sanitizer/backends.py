"""Device backends: one code path for CUDA, Ascend NPU and the simulated
device, parameterised by how each names streams and reports events.

A backend connects the framework's trace callbacks once per process (they
cannot be unregistered) and routes them to whichever sanitizer is enabled.
Stream keys are ``(device_index, raw handle)``: handle 0, the default
stream, exists on every device.
"""
from __future__ import annotations

import weakref
from typing import Callable, Optional

import torch

from .. import simdevice


class Backend:
    device_type = ""
    allocations_by_first_sight = False  # no allocator callbacks: see new storages in outputs

    def __init__(self) -> None:
        self.sink = None
        self._connected = False

    def connect(self, sink) -> None:
        self.sink = sink
        if not self._connected:
            self._connect()
            self._connected = True

    def disconnect(self) -> None:
        self.sink = None

    def _route(self, name: str) -> Callable:
        def forward(*args):
            sink = self.sink
            if sink is not None:
                getattr(sink, name)(*args)

        return forward

    def tracks(self, tensor: torch.Tensor) -> bool:
        return tensor.device.type == self.device_type

    # per-backend
    def _connect(self) -> None:
        raise NotImplementedError

    def current_stream(self, device_index: int) -> tuple:
        raise NotImplementedError

    def stream_key(self, stream) -> tuple:
        raise NotImplementedError

    def current_device(self) -> int:
        raise NotImplementedError

    def describe(self, key: tuple) -> str:
        device, handle = key
        where = f"{self.device_type}:{device}"
        return f"default stream ({where})" if handle == 0 else f"stream {handle:#x} ({where})"


class _TraceBackend(Backend):
    """CUDA and NPU: torch's (or torch_npu's) GPU trace callbacks."""

    def _key(self, handle: int) -> tuple:
        return (self.current_device(), handle)

    def _register_trace(self, register: Callable) -> None:
        """``register(kind, callback)`` for each trace kind."""
        route = self._route
        register("event_creation", route("on_event_created"))
        register("event_deletion", route("on_event_deleted"))
        register("event_record", lambda e, s: route("on_event_record")(e, self._key(s)))
        register("event_wait", lambda e, s: route("on_event_wait")(e, self._key(s)))
        register("memory_allocation", lambda ptr: route("on_trace_alloc")(ptr, self.current_device()))
        register("memory_deallocation", route("on_trace_free"))
        register("stream_creation", lambda s: route("on_stream_created")(self._key(s)))
        register("device_synchronization", lambda: route("on_device_sync")(self.current_device()))
        register("stream_synchronization", lambda s: route("on_stream_sync")(self._key(s)))
        register("event_synchronization", route("on_event_sync"))

    def _patch_queries(self, event_class, stream_class, event_handle: Callable) -> None:
        """A query that returned True is a host synchronisation the trace
        does not report."""
        backend = self
        event_query, stream_query = event_class.query, stream_class.query
        event_class.raw_query = event_query  # for our own reclaimer: no host knowledge

        def query_event(event):
            done = event_query(event)
            if done and backend.sink is not None:
                backend.sink.on_event_sync(event_handle(event))
            return done

        def query_stream(stream):
            done = stream_query(stream)
            if done and backend.sink is not None:
                backend.sink.on_stream_sync(backend.stream_key(stream))
            return done

        event_class.query, stream_class.query = query_event, query_stream


class CudaBackend(_TraceBackend):
    device_type = "cuda"

    def _connect(self) -> None:
        from torch.cuda import _gpu_trace

        torch._C._activate_gpu_trace()
        self._register_trace(lambda kind, cb: getattr(_gpu_trace, f"register_callback_for_{kind}")(cb))
        self._patch_queries(torch.cuda.Event, torch.cuda.Stream, lambda e: e.cuda_event)

    def current_device(self) -> int:
        return torch._C._cuda_getDevice()  # torch.cuda.current_device() without its Python layers

    def current_stream(self, device_index: int) -> tuple:
        return (device_index, torch._C._cuda_getCurrentRawStream(device_index))

    def stream_key(self, stream) -> tuple:
        if not isinstance(stream, torch.cuda.Stream):
            stream = torch.cuda.Stream(
                stream_id=stream.stream_id, device_index=stream.device_index, device_type=stream.device_type
            )
        return (stream.device_index, stream.cuda_stream)


class NpuBackend(_TraceBackend):
    """torch_npu: written against its published trace API
    (torch_npu.utils._npu_trace, torch_npu._C._activate_npu_trace); it has
    not run on an NPU here."""

    device_type = "npu"

    def _connect(self) -> None:
        import torch_npu
        import torch_npu.utils._npu_trace as npu_trace

        torch_npu._C._activate_npu_trace(0)  # stream-check mode

        def register(kind: str, cb: Callable) -> None:
            getattr(npu_trace, f"register_callback_for_npu_{kind}")(cb, f"npu_lifetime_{kind}")

        self._register_trace(register)
        register("record_stream", lambda ptr, s: self._route("on_record_stream_ptr")(ptr, self._key(s)))
        register("erase_stream", lambda ptr, s: self._route("on_erase_stream_ptr")(ptr, self._key(s)))
        self._patch_queries(torch_npu.npu.Event, torch_npu.npu.Stream, lambda e: e.npu_event)

    def current_device(self) -> int:
        return torch.npu.current_device()

    def current_stream(self, device_index: int) -> tuple:
        return (device_index, int(torch.npu.current_stream(device_index).npu_stream))

    def stream_key(self, stream) -> tuple:
        import torch_npu

        if not isinstance(stream, torch_npu.npu.Stream):
            stream = torch_npu.npu.Stream(
                stream_id=stream.stream_id, device_index=stream.device_index, device_type=stream.device_type
            )
        return (stream.device_index, int(stream.npu_stream))


class SimBackend(Backend):
    """CPU tensors on the simulated device (``npu_lifetime.simdevice``)."""

    device_type = "cpu"
    allocations_by_first_sight = True

    def _connect(self) -> None:
        simdevice.add_listener(_SimListener(self))

    def current_device(self) -> int:
        return simdevice.DEVICE_INDEX

    def current_stream(self, device_index: int) -> tuple:
        return simdevice.current_stream().key

    def stream_key(self, stream) -> tuple:
        if isinstance(stream, simdevice.Stream):
            return stream.key
        return (stream.device_index, stream.stream_id)

    def watch(self, tensor: torch.Tensor, on_free: Callable[[int], None]) -> None:
        """Calls ``on_free(address)`` when the tensor's storage dies."""
        storage = tensor.untyped_storage()
        weakref.finalize(storage, on_free, storage.data_ptr())

    def describe(self, key: tuple) -> str:
        return "sim default stream" if key[1] == 0 else f"sim stream {key[1]}"


class _SimListener:
    def __init__(self, backend: SimBackend) -> None:
        self.backend = backend

    def __getattr__(self, name: str):
        return self.backend._route(name)


_BACKENDS: dict = {}
_CLASSES = {"cuda": CudaBackend, "npu": NpuBackend, "sim": SimBackend, "cpu": SimBackend}


def backend_for(device: str) -> Backend:
    if device not in _CLASSES:
        raise ValueError(f"device must be one of cuda, npu, sim; not {device!r}")
    cls = _CLASSES[device]
    if cls not in _BACKENDS:
        _BACKENDS[cls] = cls()
    return _BACKENDS[cls]


def active_backend() -> Optional[Backend]:
    return next((b for b in _BACKENDS.values() if b.sink is not None), None)
