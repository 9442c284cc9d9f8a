"""Records what the pictures need while code runs: the shim's allocator
trace, the Python call site of every shim allocation and free (through the
shim's hooks), and at the end its findings, snapshot and statistics.

    recorder = Recorder().start()
    ...                                  # code that allocates through the shim
    recording = recorder.stop("train.py")
"""
from __future__ import annotations

import os
import sys
import sysconfig
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Optional

from ..sanitizer import native, sites
from ..shim import api, hooks
from .trace import check_events, shim_has_trace

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass
class Recording:
    source: str
    snapshot: dict
    stats: object  # shim.api.ShimStats
    events: Optional[list]  # None: this shim has no allocator trace
    dropped: int  # trace events the shim dropped (its buffer was full)
    shim_findings: list
    frames: dict  # trace position -> Python frames of that alloc/free, innermost first
    sanitizer_findings: list = field(default_factory=list)  # timeline.SanitizerFinding
    notes: list = field(default_factory=list)  # what the reader should know (shown with the pictures)
    stream_names: dict = field(default_factory=dict)  # stream handle -> its role, where known
    storages_html: str = ""  # with --sanitize: the storages the sanitizer reported on (storage_lines.render)

    @property
    def block_count(self) -> int:
        traced = sum(1 for e in self.events or () if e["kind"] == "alloc")
        held = sum(1 for s in self.snapshot["segments"] for b in s["blocks"] if b["state"] != "cached")
        return max(traced, held)


class Recorder:
    def __init__(self, capacity: int = 1 << 20, stack_depth: int = 24) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int):
            raise TypeError(f"the trace capacity must be an int (events), not {type(capacity).__name__} {capacity!r}")
        if capacity < 1:
            raise ValueError(f"the trace capacity must be at least 1 event, not {capacity}")
        self.capacity = capacity
        self.stack_depth = stack_depth
        self._capture = native.default().capture  # the sanitizer's stack walk: C where built
        self.has_trace = shim_has_trace()
        self._sites = {"alloc": defaultdict(deque), "free": defaultdict(deque)}
        self._subscription = None
        self._dropped_before = 0

    def start(self) -> "Recorder":
        if self._subscription is not None:
            raise RuntimeError("this Recorder is already recording: stop() it before starting it again")
        if self.has_trace:
            api.set_trace(False)
            api.trace()  # what an earlier trace left is not this run's
            self._dropped_before = _dropped()
            api.set_trace(True, self.capacity)
        self._subscription = hooks.subscribe(self._on_alloc, self._on_free)
        return self

    def stop(self, source: str) -> Recording:
        if self._subscription is None:
            raise RuntimeError("this Recorder is not recording: start() it first")
        hooks.unsubscribe(self._subscription)
        self._subscription = None
        events, notes = None, []
        if self.has_trace:
            events = check_events(api.trace())
            api.set_trace(False)
        else:
            notes.append("This shim build has no allocator trace (npu_lifetime.shim.api.set_trace): the pickle "
                         "holds the final state only and the timeline has nothing to draw.")
        dropped = _dropped() - self._dropped_before if self.has_trace else 0
        frames = {}
        if dropped:
            notes.append(f"The shim's trace buffer overflowed: {dropped} events were dropped (raise --trace-capacity); "
                         "call sites are left out, since they can no longer be matched to trace events.")
        elif events is not None:
            frames = self._match_sites(events)
        return Recording(source, api.snapshot(), api.stats(), events, dropped, api.findings(), frames, notes=notes)

    # the hooks run inside the shim's alloc/free, on the calling thread
    def _on_alloc(self, ptr: int, _size: int, _device: int, _stream: int) -> None:
        self._sites["alloc"][ptr].append(self._capture(self.stack_depth, 1))

    def _on_free(self, ptr: int, _size: int, _device: int, _stream: int) -> None:
        self._sites["free"][ptr].append(self._capture(self.stack_depth, 1))

    def _match_sites(self, events: list) -> dict:
        """Each alloc/free event gets the site its hook saw: per address, the
        hooks and the trace see the same calls in the same order."""
        frames = {}
        for i, e in enumerate(events):
            queue = self._sites.get(e["kind"], {}).get(e["ptr"])
            if queue:
                frames[i] = user_frames(queue.popleft())
        return frames


def _dropped() -> int:
    return api.stats().get("trace_dropped", 0)


def user_frames(site) -> list:
    """The site's frames in the viewer's form, innermost first, without
    this package's (except those standing for the user's program:
    sites.user_program), torch's, the standard library's and
    the console-script launchers' (``bin/npu-lifetime``)."""
    if site is None:
        return []
    paths = sysconfig.get_paths()
    hidden = [_PACKAGE_DIR, paths["stdlib"], paths["scripts"], os.path.join(sys.prefix, "bin")]
    torch = sys.modules.get("torch")
    if torch is not None and getattr(torch, "__file__", None):
        hidden.append(os.path.dirname(os.path.abspath(torch.__file__)))
    out = []
    for code, line in site.frames:
        filename = code.co_filename
        if filename.startswith(tuple(hidden)) and not sites.user_program(filename):
            continue
        out.append({"filename": filename, "line": line, "name": code.co_name})
    return out
