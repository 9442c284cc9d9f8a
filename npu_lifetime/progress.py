"""A one-line progress display on stderr (rewritten in place on a terminal,
a line every tenth of the way otherwise)."""
from __future__ import annotations

import sys
import time
from typing import Optional, TextIO


class Progress:
    def __init__(self, total: int, label: str, unit: str, stream: Optional[TextIO] = None) -> None:
        self.total, self.label, self.unit = total, label, unit
        self.out = stream or sys.stderr
        self.start = time.perf_counter()
        self.tty = self.out.isatty()
        self._last_draw = 0.0
        self._last_tenth = -1

    def __call__(self, done: int) -> None:
        now = time.perf_counter()
        tenth = done * 10 // max(1, self.total)
        if self.tty and now - self._last_draw < 0.2 and done < self.total:
            return
        if not self.tty and tenth == self._last_tenth:
            return
        self._last_draw, self._last_tenth = now, tenth
        rate = done / max(now - self.start, 1e-9)
        line = f"{self.label}: {done}/{self.total} {self.unit} ({rate:,.0f}/s)"
        self.out.write(("\r" + line) if self.tty else line + "\n")
        self.out.flush()

    def close(self) -> None:
        if self.tty:
            self.out.write("\n")
            self.out.flush()
