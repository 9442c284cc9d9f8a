"""Which storage lives at each address, for one sanitizer, and where each
came from.

A storage is known from its allocation (the device's allocation trace, the
shim's hook, or, on the simulated device, its first sight as an op's fresh
output) and named by a new id each time, so memory reused at an address
starts clean.  A storage first seen as an op's input was allocated before
the sanitizer was enabled: it is adopted with the allocation stream the
device's allocator reports for its block (from a snapshot taken when the
sanitizer was enabled), or the device's default stream where the allocator
has no record (host memory on the simulated device), never with the stream
it happens to be first seen on.
"""
from __future__ import annotations

import itertools
from typing import Callable, Optional

from ..lifetime import LifetimeModel
from . import sites
from .backends import Backend


class StorageTable:
    def __init__(self, model: LifetimeModel, backend: Backend, on_free: Callable[[int], None],
                 on_found: Callable[[list], None] = lambda found: None) -> None:
        self.model = model
        self.backend = backend
        self._on_free = on_free  # watched storages (simulated device) report their death here
        self._on_found = on_found  # the findings of a free learnt at a new allocation (never dropped)
        self.live: dict = {}  # address -> storage id (read directly on the hot path)
        self.sizeless: set = set()  # ids allocated with an unknown size (trace allocations)
        self._ids = itertools.count(1)
        self._blocks_before: dict = {}  # address -> allocation stream, for storages from before tracking

    def take_snapshot(self) -> None:
        """Asks the device's allocator which blocks are live, and on which
        streams they were allocated (called when the sanitizer is enabled)."""
        self._blocks_before.clear()  # in place: the native storage feed holds this dict
        self._blocks_before.update(self.backend.live_blocks())

    def get(self, address: int) -> Optional[int]:
        return self.live.get(address)

    def __len__(self) -> int:
        return len(self.live)

    def allocate(self, address: int, nbytes: int, stream: tuple, site, tensor=None) -> int:
        self._blocks_before.pop(address, None)
        old = self.live.pop(address, None)
        if old is not None:  # its free was not seen (e.g. a storage moved by a call not watched)
            self.sizeless.discard(old)
            found = self.model.free(old, site)
            if found:
                self._on_found(found)  # what is known of the old storage, named by its own id
        sid = next(self._ids)
        self.live[address] = sid
        if not nbytes:
            self.sizeless.add(sid)
        self.model.allocate(sid, stream, address, nbytes, site)
        if tensor is not None and self.backend.allocations_by_first_sight:
            self.backend.watch(tensor, self._on_free, sid)
        return sid

    def adopt(self, address: int, nbytes: int, device_index: int, tensor=None) -> int:
        """A storage allocated before tracking began."""
        stream = self._blocks_before.pop(address, None) or self.backend.default_stream(device_index)
        if not self.model.has_stream(stream):
            self.model.create_stream(stream, device=stream[0])
        sid = next(self._ids)
        self.live[address] = sid
        self.model.allocate(sid, stream, address, nbytes, sites.UNTRACKED, preexisting=True)
        if tensor is not None and self.backend.allocations_by_first_sight:
            self.backend.watch(tensor, self._on_free, sid)
        return sid

    def sized(self, sid: int, access) -> None:
        """The size of a storage allocated with none, from an access to it
        (a ``StorageAccess``: its size is read only if still unknown)."""
        if sid in self.sizeless:
            nbytes = access.nbytes
            if nbytes:
                self.sizeless.discard(sid)
                self.model.set_size(sid, nbytes)

    def free(self, address: int, site, sid: Optional[int] = None) -> list:
        """The storage at ``address`` was freed; with ``sid``, only if that
        storage is still the one there (a watched storage that moved to new
        memory, or whose address went to another, is not freed twice)."""
        if sid is not None and self.live.get(address) != sid:
            return []
        sid = self.live.pop(address, None)
        if sid is None:
            self._blocks_before.pop(address, None)
            return []  # allocated before the sanitizer was enabled and never used since
        self.sizeless.discard(sid)
        return self.model.free(sid, site=site)
