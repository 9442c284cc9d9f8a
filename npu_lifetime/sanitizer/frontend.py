"""The lifetime sanitizer on a real torch program: a TorchDispatchMode that
derives each op's reads and writes from its schema, plus the device's
stream, event, synchronisation and allocation events, all fed to the
lifetime model.  Findings are the model's."""
from __future__ import annotations

import itertools
import sys
import threading
import warnings
from typing import Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..lifetime import DataRace, LifetimeModel, UncoveredFree
from . import report, sites
from .accesses import op_accesses
from .backends import Backend, backend_for

ON_RACE = ("raise", "warn", "collect")


class LifetimeWarning(UserWarning):
    pass


class DataRaceError(RuntimeError):
    """Raised at an access that races (with ``on_race="raise"``)."""

    def __init__(self, races: list, text: str) -> None:
        super().__init__(text)
        self.races = races


class _Mode(TorchDispatchMode):
    def __init__(self, sanitizer: "LifetimeSanitizer") -> None:
        super().__init__()
        self.sanitizer = sanitizer

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        san = self.sanitizer
        handled = san._before_op(func, args, kwargs)
        if handled:
            return func(*args, **kwargs)
        # one capture per op, shared with the allocations and frees inside it
        site = sites.capture(san.stack_depth, skip=1)
        tls = san._tls
        outer, tls.site = getattr(tls, "site", None), site
        try:
            outputs = func(*args, **kwargs)
        finally:
            tls.site = outer
        san._after_op(func, args, kwargs, outputs, site)
        return outputs


class LifetimeSanitizer:
    """Tracks every access per stream and reports data races (at the access)
    and uncovered frees (at the free, retained until ``flush``)."""

    def __init__(
        self,
        device: str = "cuda",
        on_race: str = "raise",
        warn_on_free: bool = True,
        stack_depth: int = 16,
    ) -> None:
        if on_race not in ON_RACE:
            raise ValueError(f"on_race must be one of {ON_RACE}, not {on_race!r}")
        self.backend: Backend = backend_for(device)
        self.on_race = on_race
        self.warn_on_free = warn_on_free
        self.stack_depth = stack_depth
        self.model = LifetimeModel(on_finding=self._on_finding)
        self.enabled = False
        self._mode: Optional[_Mode] = None
        self._lock = threading.RLock()
        self._live: dict = {}  # address -> storage id
        self._ids = itertools.count(1)
        self._known_events: set = set()
        self._races: list = []
        self._shim_hooks = None
        self._record_use = _record_use_op()
        self._tls = threading.local()  # the site of the op being dispatched

    # -- enabling ---------------------------------------------------------------
    def enable(self) -> "LifetimeSanitizer":
        if self.enabled:
            return self
        self.backend.connect(self)
        self._connect_shim()
        self._mode = _Mode(self)
        self._mode.__enter__()
        self.enabled = True
        return self

    def disable(self) -> None:
        if not self.enabled:
            return
        self._mode.__exit__(None, None, None)
        self._mode = None
        self.backend.disconnect()
        self._disconnect_shim()
        self.enabled = False

    def __enter__(self) -> "LifetimeSanitizer":
        return self.enable()

    def __exit__(self, *exc) -> None:
        self.disable()

    # -- results -------------------------------------------------------------------
    @property
    def findings(self) -> list:
        """Findings retained so far (not cleared)."""
        return list(self.model.findings)

    def flush(self) -> list:
        """The retained findings (cleared), then, for storages still alive,
        the cross-stream uses a free right now would leave uncovered."""
        with self._lock:
            return self.model.flush()

    def flush_by_stream(self) -> dict:
        """``flush()`` grouped by usage stream (the access stream of a race)."""
        grouped: dict = {}
        for f in self.flush():
            stream = getattr(f, "usage_stream", None) or getattr(getattr(f, "access", None), "stream", None)
            grouped.setdefault(self.describe(stream) if stream is not None else "host", []).append(f)
        return grouped

    def describe(self, stream_key) -> str:
        return self.backend.describe(stream_key)

    def report(self, findings: Optional[list] = None) -> str:
        return report.format_findings(self.findings if findings is None else findings, self.describe)

    def to_json(self, findings: Optional[list] = None) -> list:
        return report.to_json(self.findings if findings is None else findings, self.describe)

    # -- lifetime calls seen outside the dispatcher ---------------------------------
    def record_use(self, tensor: torch.Tensor, stream_key: tuple) -> None:
        self._storage_call(tensor, stream_key, self.model.record_use)

    def record_stream(self, tensor: torch.Tensor, stream_key: tuple) -> None:
        self._storage_call(tensor, stream_key, self.model.record_stream)

    def erase_stream(self, tensor: torch.Tensor, stream_key: tuple) -> None:
        self._storage_call(tensor, stream_key, self.model.erase_stream)

    def track_allocation(self, tensor: torch.Tensor, stream_key: tuple) -> None:
        """A storage allocated on ``stream_key`` by an allocator the backend
        does not see (the simulated device's hand-off harness)."""
        site = sites.capture(self.stack_depth, skip=2)
        with self._lock:
            self._adopt(tensor, self._stream(stream_key), site, preexisting=False)

    # -- the dispatcher ----------------------------------------------------------------
    def _before_op(self, func, args, kwargs) -> bool:
        """Handles lifetime ops; True when ``func`` is one (no accesses)."""
        if func is torch.ops.aten.record_stream.default:
            tensor, stream = args[0], args[1] if len(args) > 1 else kwargs["s"]
            if self.backend.tracks(tensor):
                self._storage_call(tensor, self.backend.stream_key(stream), self.model.record_stream)
            return True
        if func is self._record_use:
            tensor, stream_id, device_index, device_type = args
            if self.backend.tracks(tensor):
                stream = torch.Stream(stream_id=stream_id, device_index=device_index, device_type=device_type)
                self._storage_call(tensor, self.backend.stream_key(stream), self.model.record_use)
            return True
        return False

    def _site(self, skip: int):
        """The current op's site when inside one, else a fresh capture."""
        site = getattr(self._tls, "site", None)
        return site if site is not None else sites.capture(self.stack_depth, skip=skip + 1)

    def _after_op(self, func, args, kwargs, outputs, site) -> None:
        accesses = op_accesses(func, args, kwargs, outputs, self.backend.tracks)
        if not accesses:
            return
        op = func._schema.name
        with self._lock:
            stream = self._stream(self.backend.current_stream(accesses[0].device_index))
            for access in accesses:
                storage = self._storage_for(access, stream, site)
                self.model.access(storage, stream, access.is_write, op, site)
            races, self._races = self._races, []
        if races:
            self._raise_or_warn(races)

    def _raise_or_warn(self, races: list) -> None:
        text = report.format_findings(races, self.describe)
        if self.on_race == "raise":
            print(text, file=sys.stderr)
            raise DataRaceError(races, text)
        if self.on_race == "warn":
            warnings.warn(text, LifetimeWarning, stacklevel=4)

    def _on_finding(self, finding) -> None:
        if isinstance(finding, DataRace):
            self._races.append(finding)
        elif isinstance(finding, UncoveredFree) and self.warn_on_free and not finding.live:
            warnings.warn(report.format_findings([finding], self.describe), LifetimeWarning, stacklevel=2)

    # -- storages and streams ----------------------------------------------------------
    def _stream(self, key: tuple) -> tuple:
        if not self.model.has_stream(key):
            self.model.create_stream(key, device=key[0])
        return key

    def _storage_for(self, access, stream, site) -> int:
        storage = self._live.get(access.storage)
        if storage is not None:
            return storage
        fresh = self.backend.allocations_by_first_sight and access.fresh
        return self._adopt(access.tensor, stream, site, preexisting=not fresh)

    def _adopt(self, tensor, stream, site, preexisting: bool) -> int:
        """Tracks the storage of ``tensor`` from now on; on the simulated
        device (no allocator callbacks) its death is watched too."""
        storage = tensor.untyped_storage()
        sid = self._allocate(storage.data_ptr(), storage.nbytes(), stream, site, preexisting=preexisting)
        if self.backend.allocations_by_first_sight:
            self.backend.watch(tensor, self._free)
        return sid

    def _allocate(self, address, nbytes, stream, site, preexisting=False) -> int:
        old = self._live.pop(address, None)
        if old is not None:  # a free we did not see
            self.model.free(old, site)
        storage = next(self._ids)
        self._live[address] = storage
        self.model.allocate(storage, stream, address, nbytes, site, preexisting=preexisting)
        return storage

    def _storage_call(self, tensor, stream_key, call) -> None:
        if not self.backend.tracks(tensor):
            return
        storage = tensor.untyped_storage()
        site = sites.capture(self.stack_depth, skip=3)
        with self._lock:
            stream = self._stream(stream_key)
            sid = self._live.get(storage.data_ptr())
            if sid is None:
                sid = self._adopt(tensor, stream, site, preexisting=True)
            call(sid, stream, site=site)

    # -- device events (from the backend) ---------------------------------------------------
    def on_stream_created(self, key) -> None:
        with self._lock:
            self._stream(key)

    def on_event_created(self, event) -> None:
        with self._lock:
            self._known_events.add(event)
            self.model.create_event(event)

    def on_event_deleted(self, event) -> None:
        with self._lock:
            self._known_events.discard(event)
            self.model.delete_event(event)

    def on_event_record(self, event, key) -> None:
        with self._lock:
            self._known_events.add(event)
            self.model.create_event(event)
            self.model.record_event(event, self._stream(key))

    def on_event_wait(self, event, key) -> None:
        with self._lock:
            if event in self._known_events:  # else created and recorded before we were enabled
                self.model.wait_event(self._stream(key), event, site=self._wait_site(event))

    def on_event_sync(self, event) -> None:
        with self._lock:
            if event in self._known_events:
                self.model.synchronize_event(event, site=self._wait_site(event))

    def _wait_site(self, event):
        """A site only matters for the finding about an unrecorded event."""
        return None if self.model.event_recorded(event) else sites.capture(self.stack_depth, skip=3)

    def on_stream_sync(self, key) -> None:
        with self._lock:
            self.model.synchronize_stream(self._stream(key))

    def on_device_sync(self, device) -> None:
        with self._lock:
            self.model.synchronize_device(device)

    def on_trace_alloc(self, address, device) -> None:
        if self._shim_hooks is not None:
            return  # the shim reports allocations itself
        key = self.backend.current_stream(device)
        with self._lock:
            self._allocate(address, 0, self._stream(key), self._site(skip=1))

    def on_trace_free(self, address) -> None:
        if self._shim_hooks is None:
            self._free(address)

    def on_record_stream_ptr(self, address, key) -> None:
        with self._lock:
            sid = self._live.get(address)
            if sid is not None:
                self.model.record_stream(sid, self._stream(key))

    def on_erase_stream_ptr(self, address, key) -> None:
        with self._lock:
            sid = self._live.get(address)
            if sid is not None:
                self.model.erase_stream(sid, self._stream(key))

    def _free(self, address) -> list:
        with self._lock:
            sid = self._live.pop(address, None)
            if sid is None:
                return []  # allocated before the sanitizer was enabled
            return self.model.free(sid, site=self._site(skip=1))

    # -- the shim: allocations, frees, and deferring unsafe reuse --------------------------------
    def _connect_shim(self) -> None:
        from ..shim.install import installed

        setup = installed()
        if setup is None or setup.device != self.backend.device_type:
            return
        from ..shim import api, hooks

        def on_alloc(ptr, size, device, stream):
            with self._lock:
                key = self._stream((device, stream))
                self._allocate(ptr, size, key, self._site(skip=0))

        def on_free(ptr, _size, _device, _stream):
            for finding in self._free(ptr):
                if isinstance(finding, UncoveredFree):
                    api.note_use(ptr, finding.usage_stream[1])  # the shim defers the reuse

        self._shim_hooks = hooks.subscribe(on_alloc, on_free)

    def _disconnect_shim(self) -> None:
        if self._shim_hooks is not None:
            from ..shim import hooks

            hooks.unsubscribe(self._shim_hooks)
            self._shim_hooks = None


def _record_use_op():
    from ..recording import record_use_op

    return record_use_op()
