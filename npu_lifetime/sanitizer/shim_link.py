"""A sanitizer's link to the allocator shim, when the shim is the device's
allocator: allocations and frees come from the shim's hooks (the device
trace's memory callbacks do not fire under a pluggable allocator), each
with its exact address range and stream; and for each uncovered free the
shim is told of the outstanding use (``note_use``) from inside the free hook,
so it holds the block back from reuse until that use is done; such a free
stays latent (the allocator holds it), whatever reuses its memory later."""
from __future__ import annotations

from ..lifetime import UncoveredFree


class ShimLink:
    def __init__(self, sanitizer) -> None:
        self.sanitizer = sanitizer
        self._subscription = None
        self.connected = False  # an attribute, not a property: read at every traced allocation and free

    def connect(self) -> bool:
        from ..shim.state import installed

        setup = installed()
        if setup is None or setup.device != self.sanitizer.backend.device_type:
            return False
        from ..shim import api, hooks

        sanitizer = self.sanitizer

        def on_findings(ptr, found):
            sanitizer._free_found(found)
            for finding in found:
                if isinstance(finding, UncoveredFree) and api.note_use(ptr, finding.usage_stream[1]):
                    sanitizer.allocator_holds(finding)  # the shim defers the reuse: it cannot race

        feed = sanitizer._storage_feed  # its methods themselves: in C, no Python frame per allocation or free
        self._subscription = hooks.subscribe(feed.shim_alloc, feed.shim_free, on_findings)
        self.connected = True
        return True

    def disconnect(self) -> None:
        if self._subscription is not None:
            from ..shim import hooks

            hooks.unsubscribe(self._subscription)
            self._subscription = None
            self.connected = False
