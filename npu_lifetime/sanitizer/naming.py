"""Names a user can paste: tensors and streams as the program wrote them.

A stream is named by the variable its creation was assigned to (``side =
torch.cuda.Stream()`` -> ``side``), read from the source line of the user
frame that created it; the default stream by the call that returns it on
its device.  A tensor is named by the variable at its allocation site (``y =
x * 2`` -> ``y``), else by that site.  Fixes use calls that run on the
device in question: ``x.record_stream(s)`` on CUDA and NPU,
``npu_lifetime.record_stream(x, s)`` on the simulated device (whose CPU
tensors' ``Tensor.record_stream`` refuses its streams).
"""
from __future__ import annotations

import linecache
import re
from typing import Optional

_TARGET = re.compile(r"^\s*(?:with\b.*\bas\s+)?([A-Za-z_][\w.]*(?:\s*,\s*[A-Za-z_][\w.]*)*)\s*(?::[^=]*)?=(?!=)")
_WITH_AS = re.compile(r"\bas\s+([A-Za-z_]\w*)\s*:")


def _source_line(site) -> Optional[tuple]:
    frames = site.user_frames() if site is not None and hasattr(site, "user_frames") else []
    if not frames:
        return None
    filename, line, _ = frames[0]
    return filename, line, linecache.getline(filename, line)


def assigned_names(site) -> tuple:
    """The names the statement at ``site``'s innermost user frame assigns
    (``a, b = ...`` -> ``("a", "b")``; ``with ... as s:`` -> ``("s",)``)."""
    found = _source_line(site)
    if found is None:
        return ()
    text = found[2]
    match = _TARGET.match(text)
    if match and "==" not in text[:match.end()]:
        return tuple(name.strip() for name in match.group(1).split(","))
    match = _WITH_AS.search(text)
    return (match.group(1),) if match else ()


def where(site) -> str:
    frames = site.user_frames() if site is not None and hasattr(site, "user_frames") else []
    if not frames:
        return str(site) if site is not None else "<no stack>"
    filename, line, _ = frames[0]
    return f"{filename.rsplit('/', 1)[-1]}:{line}"


class Names:
    """How one sanitizer names streams (in prose and in code) and tensors."""

    def __init__(self, backend) -> None:
        self.backend = backend
        self._streams: dict = {}  # stream key -> the variable it was assigned to
        self._per_line: dict = {}  # (file, line) -> streams created there so far

    # -- streams ----------------------------------------------------------------
    def note_stream(self, key: tuple, site) -> None:
        """A stream was created at ``site``."""
        names = assigned_names(site)
        if not names or key in self._streams:
            return
        found = _source_line(site)
        where_key = found[:2] if found else None
        index = self._per_line.get(where_key, 0)
        self._per_line[where_key] = index + 1
        self._streams[key] = names[index % len(names)]

    def __call__(self, key) -> str:
        """A stream in prose: the backend's description and its variable."""
        text = self.backend.describe(key)
        code = self._streams.get(key)
        return f"{text} (`{code}`)" if code else text

    def stream_code(self, key) -> Optional[str]:
        """An expression for the stream, or None when there is none (a
        stream whose creation was not seen, a collective's own stream)."""
        code = self._streams.get(key)
        if code:
            return code
        device, handle = key
        if handle == 0:
            return {"cpu": "npu_lifetime.simdevice.default_stream()",
                    "cuda": f"torch.cuda.default_stream({device})",
                    "npu": f"torch.npu.default_stream({device})"}.get(self.backend.device_type)
        return None

    def stream_arg(self, key) -> str:
        """The stream as an argument in a fix: its expression, or a
        placeholder that says which stream to put there."""
        code = self.stream_code(key)
        return code if code else f"<{self.backend.describe(key)}>"

    def is_collective(self, key) -> bool:
        return self.backend.device_type == "cpu" and key[1] < 0

    # -- tensors ------------------------------------------------------------------
    def tensor(self, alloc_site) -> tuple:
        """``(code, known)``: the variable the tensor was assigned to at its
        allocation, else ``x`` (not known: the report says where it was
        allocated)."""
        names = assigned_names(alloc_site)
        if len(names) == 1:
            return names[0], True
        return "x", False

    def tensor_prose(self, alloc_site) -> str:
        code, known = self.tensor(alloc_site)
        if known:
            return f"`{code}` (allocated at {where(alloc_site)})"
        return f"the tensor allocated at {where(alloc_site)}"

    def record_stream(self, tensor: str, stream: str) -> str:
        if self.backend.device_type == "cpu":
            return f"npu_lifetime.record_stream({tensor}, {stream})"
        return f"{tensor}.record_stream({stream})"
