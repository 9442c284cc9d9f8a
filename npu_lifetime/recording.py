"""``record_use(tensor, stream=None)``: precise cross-stream lifetime.

An event is recorded on ``stream`` at the call; the tensor's memory is not
reused until every such event has fired.  It covers what is queued on
``stream`` up to the call (and what that is ordered after), not later work.
No-op on the tensor's allocation stream; repeated calls on one stream keep
one live event (a stream runs in order, so the later record subsumes).

* Under the shim (``npu_lifetime.install``) the event is attached to the
  allocator block: exact.
* Under a native caching allocator, a fallback: the event plus an owned
  reference to the storage, dropped once the event has fired (checked at
  each call and by a background reclaimer every ``poll_interval_s``), so
  memory outlives its last user reference by a bounded lag.
* On the simulated device (CPU tensors, ``npu_lifetime.simdevice`` streams)
  it only informs the sanitizer: host memory has no stream to outlive.

The call goes through the custom op ``npu_lifetime::record_use`` so that
the sanitizer's dispatch mode sees it and ``torch.compile`` traces it.
"""
from __future__ import annotations

import atexit
import threading
from typing import Optional

import torch

from . import simdevice
from .shim import api as shim_api
from .shim.install import device_stream, installed, stream_handle

DEVICE_TYPES = ("cuda", "npu")


class RecordUseError(ValueError):
    pass


def record_use(tensor: torch.Tensor, stream=None) -> None:
    """Keeps ``tensor``'s memory from being reused until the work queued on
    ``stream`` (default: the current stream) so far has finished."""
    if torch.compiler.is_compiling():
        # traced by torch.compile: no checks dynamo cannot follow, just the op
        stream = stream if stream is not None else _device_module(tensor.device.type).current_stream()
        record_use_op()(tensor, stream.stream_id, stream.device_index, stream.device_type)
        return
    if not isinstance(tensor, torch.Tensor):
        raise RecordUseError(f"record_use needs a tensor, not {type(tensor).__name__}")
    if isinstance(stream, simdevice.Stream) or (stream is None and tensor.device.type == "cpu"):
        _notify_simulated_sanitizer(tensor, stream or simdevice.current_stream(), "record_use")
        return
    stream = _checked_stream(tensor, stream)
    if _watching_sanitizer(tensor.device.type):
        # through the op, so the sanitizer's dispatch mode sees the call
        record_use_op()(tensor, stream.stream_id, stream.device_index, stream.device_type)
    else:
        _apply(tensor, stream)


def _watching_sanitizer(device_type: str) -> bool:
    """Whether an enabled sanitizer watches ``device_type``."""
    from .sanitizer import watchers

    return watchers.watching(device_type)


def _notify_sanitizers(call: str, tensor: torch.Tensor, stream) -> None:
    from .sanitizer import watchers

    watchers.notify(call, tensor, stream)


def record_stream(tensor: torch.Tensor, stream) -> None:
    """``tensor.record_stream(stream)``, also for simdevice streams."""
    if isinstance(stream, simdevice.Stream):
        _notify_simulated_sanitizer(tensor, stream, "record_stream")
    else:
        tensor.record_stream(stream)


def erase_stream(tensor: torch.Tensor, stream) -> None:
    """Withdraws an earlier ``record_stream(stream)`` (torch_npu's eraseStream):
    the free no longer waits for ``stream``.  Supported under the shim and on
    the simulated device; the native caching allocators keep no handle for it."""
    if isinstance(stream, simdevice.Stream):
        _notify_simulated_sanitizer(tensor, stream, "erase_stream")
        return
    setup = installed()
    if setup is None or setup.device != tensor.device.type:
        raise RecordUseError("erase_stream needs the shim (npu_lifetime.install) or a simdevice stream")
    typed = device_stream(tensor.device.type, stream)
    shim_api.erase_stream(tensor.untyped_storage().data_ptr(), stream_handle(typed))
    _notify_sanitizers("erase_stream", tensor, typed)


def _checked_stream(tensor: torch.Tensor, stream):
    device = tensor.device
    if device.type not in DEVICE_TYPES:
        raise RecordUseError(
            f"record_use needs a cuda or npu tensor (or a simdevice stream); this one is on {device}"
        )
    module = _device_module(device.type)
    if stream is None:
        stream = module.current_stream(device)
    if stream.device != device:
        raise RecordUseError(f"stream {stream} is on {stream.device}, the tensor on {device}")
    storage = tensor.untyped_storage()
    if storage.nbytes() == 0 or storage.data_ptr() == 0:
        raise RecordUseError("record_use on a freed storage (its memory was already released, e.g. by resize_(0))")
    return stream


def _device_module(device_type: str):
    if device_type == "cuda":
        return torch.cuda
    import torch_npu  # noqa: F401  (registers torch.npu)

    return torch.npu


def _notify_simulated_sanitizer(tensor: torch.Tensor, stream: simdevice.Stream, call: str) -> None:
    if tensor.device.type != "cpu":
        raise RecordUseError(f"a simdevice stream goes with CPU tensors, not {tensor.device}")
    _notify_sanitizers(call, tensor, stream)


def _apply(tensor: torch.Tensor, stream) -> None:
    """The op's kernel: the shim's block event, or the fallback."""
    device_type = tensor.device.type
    typed = stream if hasattr(stream, "cuda_stream") or hasattr(stream, "npu_stream") else device_stream(device_type, stream)
    setup = installed()
    storage = tensor.untyped_storage()
    if setup is not None and setup.device == device_type:
        if not shim_api.record_use(storage.data_ptr(), stream_handle(typed)):
            raise RecordUseError(f"the shim does not know this tensor's storage: {shim_api.findings()}")
        return
    FALLBACK.record(storage, typed, _device_module(device_type))


@torch.library.custom_op("npu_lifetime::record_use", mutates_args=())
def _record_use_kernel(tensor: torch.Tensor, stream_id: int, device_index: int, device_type: int) -> None:
    _apply(tensor, torch.Stream(stream_id=stream_id, device_index=device_index, device_type=device_type))


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


class _Fallback:
    """Events and owned storage references under a native allocator."""

    def __init__(self, poll_interval_s: float = 0.001) -> None:
        self.poll_interval_s = poll_interval_s
        self._held: dict = {}  # (storage id, stream handle) -> (event, storage)
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._thread: Optional[threading.Thread] = None
        self._stopping = False
        self.events_created = 0

    def record(self, storage, stream, module) -> None:
        key = (storage._cdata, stream_handle(stream))
        with self._lock:
            entry = self._held.get(key)
            if entry is None:
                event = module.Event()
                self.events_created += 1
                entry = self._held[key] = (event, storage)
            entry[0].record(stream)  # one live event per (storage, stream)
            self._reclaim_locked()
            self._ensure_thread()
            self._wake.notify()

    def held(self) -> int:
        with self._lock:
            return len(self._held)

    def reclaim(self) -> int:
        """Drops the references whose events have fired; returns how many."""
        with self._lock:
            return self._reclaim_locked()

    def wait_all(self) -> None:
        """Blocks until every held event has fired, then drops them."""
        with self._lock:
            events = [event for event, _ in self._held.values()]
        for event in events:
            event.synchronize()
        self.reclaim()

    def _reclaim_locked(self) -> int:
        # the unpatched query: the sanitizer must not learn of our own polling
        done = [key for key, (event, _) in self._held.items() if getattr(event, "raw_query", event.query)()]
        for key in done:
            del self._held[key]  # may free the storage: the event has fired
        return len(done)

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="npu_lifetime-reclaim", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        with self._lock:
            while not self._stopping:
                if self._held:
                    self._reclaim_locked()
                    self._wake.wait(timeout=self.poll_interval_s)
                else:
                    self._wake.wait()

    def shutdown(self) -> None:
        """Stops the reclaimer before the interpreter (and the device
        runtime) goes away: a thread polling events during teardown aborts
        the process."""
        with self._lock:
            self._stopping = True
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=1.0)


FALLBACK = _Fallback()
atexit.register(FALLBACK.shutdown)


def install_tensor_method() -> None:
    """Adds ``Tensor.record_use(stream=None)`` (opt-in)."""
    torch.Tensor.record_use = lambda self, stream=None: record_use(self, stream)
