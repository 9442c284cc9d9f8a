"""The shim's state and trace in the pickle format of
``torch.cuda.memory._dump_snapshot``, which PyTorch's memory viewer
(pytorch.org/memory_viz, ``torch.cuda._memory_viz``) opens.

What the viewer shows, and where this module puts what the shim knows:

- a block's ``frames`` appear when the pointer rests on it (Allocator State
  History): each block's streams and events go there first, as frames of a
  file named ``npu_lifetime`` (the RFC's open question 3), then the Python
  frames of its allocation;
- ``device_traces`` entries appear in the event list with their action,
  address, size and stream: alloc, free_requested / free_completed (the
  free, and the moment the block became reusable: the gap between them is
  the time it waited on other streams), segment_alloc / segment_free, and,
  as actions of their own, record_use, record_stream, erase_stream,
  note_use, reuse_wait, poison and finding, each with a frame saying what
  it was.  The memory plots skip actions they do not know.

The viewer replays the trace backwards from the final state, so the trace
must agree with it; ``replay_problems`` checks that the way the viewer does.
"""
from __future__ import annotations

import pickle
from typing import Optional

from .lives import Life, Lives
from .trace import describe, stream_name

ANNOTATION_FILE = "npu_lifetime"
# highest protocol the viewer's own unpickler reads (it accepts 2 to 4)
PICKLE_PROTOCOL = 4

_STATES = {"live": "active_allocated", "cached": "inactive"}  # anything else is waiting to be freed


def viewer_state(shim_state: str) -> str:
    """The viewer's block state for a shim state (pending, quarantined, ...
    are freed blocks that cannot be handed out yet)."""
    return _STATES.get(shim_state, "active_pending_free")


def note(text: str) -> dict:
    """A frame that carries a sentence instead of a source line (without
    ';', which separates frames in torch's flamegraph output)."""
    return {"filename": ANNOTATION_FILE, "line": 0, "name": text.replace(";", ",")}


def build(snapshot: dict, lives: Optional[Lives] = None, frames: Optional[dict] = None, source: str = "") -> dict:
    """The viewer's snapshot dict.  ``snapshot`` is ``shim.api.snapshot()``;
    ``lives`` the block lives of the allocator trace (None: no trace, the
    final state only); ``frames`` maps trace positions to Python frames
    (``{"filename", "line", "name"}``, innermost first)."""
    frames = frames or {}
    devices = {seg["device"] for seg in snapshot["segments"]}
    if lives is not None:
        devices |= {e["device"] for e in lives.events if e["device"] >= 0}
    traces: list = [[] for _ in range(max(devices, default=0) + 1)]
    segments = [_segment(seg, lives, frames) for seg in snapshot["segments"]]
    if lives is not None:
        final = {(s["device"], b["address"]): b["state"] for s in segments for b in s["blocks"]}
        for device, entries in _traces(lives, frames, final).items():
            traces[device] = entries
    return {
        "segments": segments,
        "device_traces": traces,
        "npu_lifetime": {
            "runtime": snapshot.get("runtime"), "policy": snapshot.get("policy"), "source": source,
            "trace_events": None if lives is None else len(lives.events),
        },
    }


def write(path: str, data: dict) -> None:
    with open(path, "wb") as f:
        pickle.dump(data, f, protocol=PICKLE_PROTOCOL)


# -- segments and blocks: the final state ------------------------------------------------
def _segment(seg: dict, lives: Optional[Lives], frames: dict) -> dict:
    blocks = [_block(b, seg["device"], lives, frames) for b in seg["blocks"]]
    allocated = [b for b in blocks if b["state"] == "active_allocated"]
    return {
        "device": seg["device"],
        "address": seg["address"],
        "total_size": seg["size"],
        "allocated_size": sum(b["size"] for b in allocated),
        "active_size": sum(b["size"] for b in blocks if b["state"] != "inactive"),
        "requested_size": sum(b["requested_size"] for b in allocated),
        "stream": seg["stream"],
        "segment_type": seg.get("pool", "large"),
        "segment_pool_id": (0, 0),
        "is_expandable": bool(seg.get("is_expandable", False)),
        "frames": [],
        "blocks": blocks,
    }


def _block(b: dict, device: int, lives: Optional[Lives], frames: dict) -> dict:
    state = viewer_state(b["state"])
    life = _current_life(lives, device, b) if state != "inactive" else None
    who = f"{life.name} (owner {life.generation} of this address): " if life is not None else ""
    notes = [note(f"{who}{b['state']} in the shim, allocated on {stream_name(b['alloc_stream'])}")] + event_notes(b)
    if life is not None:
        notes += life_notes(life, lives)
    return {
        "address": b["address"],
        "size": b["size"],
        "requested_size": b.get("requested", b["size"]),
        "state": state,
        "frames": notes + (frames.get(life.alloc, []) if life is not None and life.alloc is not None else []),
    }


def event_notes(b: dict) -> list:
    """Frames for a shim block's recorded streams, use events and held events."""
    notes = [note(f"record_stream({stream_name(s)}): its free waits for all work queued there by the free")
             for s in b["recorded_streams"]]
    for use in b["use_events"]:
        what = "a use nothing recorded (noted)" if use.get("kind") == "note_use" else "record_use event"
        notes.append(note(f"{what} on {stream_name(use['stream'])}: reuse waits for it"))
    for held in b["held_events"]:
        must = "must fire before reuse" if held.get("must_fire") else "a reuse waits for it GPU-side"
        notes.append(note(f"freed, holding an event of {stream_name(held['stream'])}: {must}"))
    return notes


def life_notes(life: Life, lives: Lives) -> list:
    """The life's story, one frame per step, with times from its alloc."""
    start = lives.t_ns(life.alloc if life.alloc is not None else 0)

    def at(index: Optional[int]) -> str:
        return f"+{(lives.t_ns(index) - start) / 1000:.1f} us" if index is not None else "?"

    steps = [(life.alloc, f"allocated on {stream_name(life.alloc_stream)}" if life.alloc is not None
              else "allocated before the trace began")]
    steps += [(m.index, describe(m.kind, m.stream, m.text)) for m in life.marks if m.index is not None]
    steps += [(life.free, "freed"), (life.pending, "pending: the free waits on events"),
              (life.reusable, "reusable")]
    steps = sorted((s for s in steps if s[0] is not None), key=lambda s: s[0])
    return [note(f"{life.name} {at(index)}: {text}") for index, text in steps]


def _current_life(lives: Optional[Lives], device: int, block: dict) -> Optional[Life]:
    """The life of the trace that owns ``block`` now (same generation)."""
    if lives is None:
        return None
    key = (device, block["address"], block.get("generation"))
    return next((life for life in reversed(lives.blocks) if life.key == key), None)


# -- the trace -------------------------------------------------------------------------------
def _traces(lives: Lives, frames: dict, final: dict) -> dict:
    """Viewer trace entries per device.  A free becomes free_requested; its
    free_completed follows at once, or where the block became reusable
    (before any later allocation that overlaps it, as the viewer needs)."""
    out: dict = {}
    waiting: dict = {}  # life key -> Life: free_requested emitted, free_completed not yet
    completed: dict = {}  # (device, addr) -> free_completed count (the viewer's block version)

    def emit(device: int, entry: dict) -> None:
        out.setdefault(device, []).append(entry)

    def complete(life: Life, t_ns: int) -> None:
        waiting.pop(life.key, None)
        emit(life.device, _entry("free_completed", life.ptr, life.size, life.alloc_stream, t_ns))
        completed[(life.device, life.ptr)] = completed.get((life.device, life.ptr), 0) + 1

    for i, e in enumerate(lives.events):
        kind, life = e["kind"], lives.life_of_event.get(i)
        device = life.device if life is not None else max(e["device"], 0)  # a finding names no device
        if kind in ("segment_alloc", "segment_free"):
            emit(device, _entry(kind, e["ptr"], e["size"], e["stream"], e["t_ns"]))
        elif kind == "alloc":
            for other in [w for w in waiting.values() if _overlaps(w, life)]:
                complete(other, e["t_ns"])
            emit(device, _entry("alloc", e["ptr"], e["size"], e["stream"], e["t_ns"],
                                life_notes(life, lives) + frames.get(i, [])))
        elif kind == "free":
            emit(device, _entry("free_requested", e["ptr"], life.size, e["stream"], e["t_ns"], frames.get(i, [])))
            waiting[life.key] = life
            if life.held_until(lives.end) is None:
                complete(life, e["t_ns"])
        elif kind == "reusable":
            if life is not None and life.key in waiting and i == life.reusable:  # the last one (quarantine)
                complete(life, e["t_ns"])
        else:
            size = life.size if life is not None else e["size"]
            who = life.name if life is not None else f"address {e['ptr']:#x}"
            text = f"{who}: {describe(kind, e['stream'], getattr(lives.mark_of_event.get(i), 'text', ''))}"
            entry = _entry(kind, e["ptr"], size, e["stream"], e["t_ns"], [note(text)])
            entry["version"] = completed.get((device, e["ptr"]), 0)  # the viewer numbers only its own actions
            emit(device, entry)
    for life in list(waiting.values()):
        if final.get((life.device, life.ptr)) != "active_pending_free":
            complete(life, lives.events[-1]["t_ns"])
    return out


def _entry(action: str, addr: int, size: int, stream: int, t_ns: int, frames: Optional[list] = None) -> dict:
    return {"action": action, "addr": addr, "size": size, "stream": stream, "time_us": t_ns // 1000,
            "frames": frames or []}


def _overlaps(a: Life, b: Life) -> bool:
    return a.device == b.device and a.ptr < b.ptr + b.size and b.ptr < a.ptr + a.size


# -- the viewer's replay ---------------------------------------------------------------------
def replay_problems(data: dict) -> list:
    """What would break the viewer's Allocator State History: it starts from
    the final segments and active blocks and undoes the trace backwards, and
    at every step each active block must lie in a segment and each undone
    free_requested must find its block.  Empty when the trace replays."""
    problems = []
    for device, trace in enumerate(data["device_traces"]):
        segments = {s["address"]: s["total_size"] for s in data["segments"] if s["device"] == device}
        blocks = {}  # addr -> size of the active blocks
        for seg in data["segments"]:
            if seg["device"] != device:
                continue
            addr = seg["address"]
            for b in seg["blocks"]:
                if b["state"] != "inactive":
                    blocks[addr] = b["size"]
                addr += b["size"]
        for i in range(len(trace) - 1, -1, -1):
            outside = [a for a in blocks if not any(s <= a < s + n for s, n in segments.items())]
            if outside:
                where = ", ".join(map(hex, outside))
                problems.append(f"device {device}, after event {i}: block(s) {where} in no segment")
            e = trace[i]
            action = e["action"]
            if action in ("free_completed", "free"):
                blocks[e["addr"]] = e["size"]
            elif action == "free_requested" and e["addr"] not in blocks:
                problems.append(f"device {device}, event {i}: free_requested of {e['addr']:#x}, no such active block")
            elif action == "alloc":
                blocks.pop(e["addr"], None)
            elif action == "segment_free":
                segments[e["addr"]] = e["size"]
            elif action == "segment_alloc" and segments.pop(e["addr"], None) is None:
                problems.append(f"device {device}, event {i}: segment_alloc of {e['addr']:#x}, no such segment")
    return problems
