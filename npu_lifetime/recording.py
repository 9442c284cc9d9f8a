"""``record_use(tensor, stream=None)``: precise cross-stream lifetime.

An event is recorded on ``stream`` at the call; the tensor's memory is not
reused until every such event has fired.  It covers what is queued on
``stream`` up to the call (and what that is ordered after), not later work.

* Under the shim (``npu_lifetime.install``) the event is attached to the
  allocator block: exact, one live event per (block, stream).
* Under a native caching allocator, a fallback: the event plus an owned
  reference to the storage, dropped once the event has fired (checked at
  each call and by a background reclaimer every ``poll_interval_s``), so
  the storage outlives the user's last reference by a bounded lag.
"""
from __future__ import annotations

import threading
from typing import Optional

import torch

from .shim import api as shim_api
from .shim.install import installed, stream_handle

DEVICE_TYPES = ("cuda", "npu")


class RecordUseError(ValueError):
    pass


def _device_module(device_type: str):
    if device_type == "cuda":
        return torch.cuda
    import torch_npu  # noqa: F401  (registers torch.npu)

    return torch.npu


def _check(tensor, stream):
    if not isinstance(tensor, torch.Tensor):
        raise RecordUseError(f"record_use needs a tensor, not {type(tensor).__name__}")
    device = tensor.device
    if device.type not in DEVICE_TYPES:
        raise RecordUseError(
            f"record_use needs a cuda or npu tensor; this one is on {device} "
            "(host memory has no stream to outlive)"
        )
    module = _device_module(device.type)
    if stream is None:
        stream = module.current_stream(device)
    if stream.device != device:
        raise RecordUseError(f"stream {stream} is on {stream.device}, the tensor on {device}")
    storage = tensor.untyped_storage()
    if storage.nbytes() == 0 or storage.data_ptr() == 0:
        raise RecordUseError("record_use on a freed storage (its memory was already released, e.g. resize_(0))")
    return module, stream, storage


def record_use(tensor: torch.Tensor, stream=None) -> None:
    """Keeps ``tensor``'s memory from being reused until the work queued on
    ``stream`` (default: the current stream) so far has finished."""
    module, stream, storage = _check(tensor, stream)
    setup = installed()
    if setup is not None and setup.device == tensor.device.type:
        if not shim_api.record_use(storage.data_ptr(), stream_handle(stream)):
            raise RecordUseError(f"the shim does not know this tensor's storage ({shim_api.findings()})")
        return
    FALLBACK.record(storage, stream, module)


class _Fallback:
    """Events and owned storage references under a native allocator."""

    def __init__(self, poll_interval_s: float = 0.001) -> None:
        self.poll_interval_s = poll_interval_s
        self._held: dict = {}  # (storage id, stream handle) -> (event, storage)
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._thread: Optional[threading.Thread] = None
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
        done = [key for key, (event, _) in self._held.items() if event.query()]
        for key in done:
            del self._held[key]  # may free the storage: the event has fired
        return len(done)

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="npu_lifetime-reclaim", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        with self._lock:
            while True:
                while not self._held:
                    self._wake.wait()
                self._reclaim_locked()
                self._wake.wait(timeout=self.poll_interval_s)


FALLBACK = _Fallback()


def install_tensor_method() -> None:
    """Adds ``Tensor.record_use(stream=None)`` (opt-in)."""
    torch.Tensor.record_use = lambda self, stream=None: record_use(self, stream)
