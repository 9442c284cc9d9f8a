"""The shim's allocator trace: the schema of one event, checked on the way in.

Each event is a dict (oldest first, as ``shim.api.trace()`` returns them)::

    {"t_ns": host monotonic ns, "kind": one of KINDS, "ptr": int, "size": int,
     "device": int, "stream": int, "alloc_stream": int, "generation": int}

``stream`` is the stream of the call (the allocation stream for alloc and
free, the recorded stream for record_*); ``generation`` counts the owners of
that address, so ``(device, ptr, generation)`` names one block life.  A
``finding`` carries only its address and stream (device -1, generation 0);
``reuse_wait`` comes just before the new owner's ``alloc``, with the old
owner's generation; a quarantined block has two ``reusable`` events
(entering and leaving quarantine).
"""
from __future__ import annotations

FIELDS = ("t_ns", "kind", "ptr", "size", "device", "stream", "alloc_stream", "generation")

KINDS = {
    "segment_alloc": "the runtime gave the shim a segment",
    "segment_free": "the shim returned a segment to the runtime",
    "alloc": "a block handed to a new owner",
    "free": "the owner freed the block",
    "record_stream": "the free will wait for everything queued on the stream by then",
    "erase_stream": "an earlier record_stream on the stream withdrawn",
    "record_use": "the free will wait for what is queued on the stream now",
    "note_use": "a use on the stream that nothing recorded (the sanitizer told the shim)",
    "pending": "the free is deferred until events on other streams fire",
    "reusable": "the block can be handed out again (its events fired, or it left quarantine)",
    "reuse_wait": "handed to its next owner at once, whose stream waits GPU-side on this owner's events",
    "poison": "the freed block was filled with the poison pattern",
    "finding": "the shim reported a finding",
}

# what happens to a block at one moment, beside its alloc and free
MARK_KINDS = ("record_stream", "erase_stream", "record_use", "note_use", "reuse_wait", "poison", "finding")
# kinds whose stream is another stream than the allocation stream (the one recorded or used)
ON_STREAM = ("record_stream", "erase_stream", "record_use", "note_use", "finding")


def stream_name(stream: int) -> str:
    return "the default stream" if stream == 0 else f"stream {stream:#x}"


def describe(kind: str, stream: int, detail: str = "") -> str:
    """One trace event in words; ``detail`` (a finding's) replaces the
    generic description of the kind."""
    where = f" on {stream_name(stream)}" if kind in ON_STREAM else ""
    return f"{kind}{where}: {detail or KINDS[kind]}"


class TraceFormatError(ValueError):
    pass


def check_events(events: list) -> list:
    """The events, as dicts with every field of the schema; a clear error
    naming the first event that is not."""
    if not isinstance(events, list):
        raise TraceFormatError(f"a trace is a list of event dicts, not {type(events).__name__}")
    for i, event in enumerate(events):
        if not isinstance(event, dict):
            raise TraceFormatError(f"trace event {i} is a {type(event).__name__}, not a dict: {event!r}")
        missing = [f for f in FIELDS if f not in event]
        if missing:
            raise TraceFormatError(f"trace event {i} lacks {', '.join(missing)}: {event!r}")
        if event["kind"] not in KINDS:
            raise TraceFormatError(
                f"trace event {i} has kind {event['kind']!r}; expected one of {', '.join(KINDS)}"
            )
        bad = [f for f in FIELDS if f != "kind" and not isinstance(event[f], int)]
        if bad:
            raise TraceFormatError(f"trace event {i}: {', '.join(bad)} must be integers: {event!r}")
    return events


def shim_has_trace() -> bool:
    """Whether the loaded shim binding offers the allocator trace."""
    from ..shim import api

    return hasattr(api, "set_trace") and hasattr(api, "trace")
