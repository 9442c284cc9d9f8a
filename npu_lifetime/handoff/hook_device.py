"""What every stand-in device for the hand-offs' hooks shares: the current
stream and the ``stream(s)`` context of the device modules (``replay.py``
writes schedule steps, ``poison.py`` drives the shim's simulated runtime)."""
from __future__ import annotations

import contextlib


class HookDevice:
    """Subclasses set ``self._current`` and provide ``Event``,
    ``record_use`` and ``record_stream``."""

    _current = None

    def current_stream(self):
        return self._current

    @contextlib.contextmanager
    def stream(self, s):
        previous, self._current = self._current, s
        try:
            yield
        finally:
            self._current = previous
