"""Where an op's own accesses go among the device events issued inside it.

A front end sees an op's accesses only around the op (a dispatch mode: the
arguments before it runs, the fresh outputs after), while the device events
the op issues itself arrive while it runs, through the device trace.  On the
device their order is fixed by what the op does:

* waits by the op's stream come before its kernels: a cross-device copy's
  barrier on the destination stream, a collective's wait on the stream that
  launched it;
* records on the op's stream come after them (a collective's end event, a
  copy's completion event), and so do host synchronisations inside the op
  (``.item()``, ``nonzero()``, a blocking copy to the host), which wait for
  the kernels they read back.

So the accesses go right before the first in-op event that is a record on
the op's stream or a host synchronisation, or after all in-op events; the
writes of fresh outputs go after the first host synchronisation, where an
op whose output size depends on the data (``nonzero``) writes its output.  The
lifetime model then sees the op as the device runs it.  (An op that
synchronises the host before its kernels, e.g. an out-of-memory retry
inside an allocation, is placed as if the sync came after: such syncs are
rare and only ever make the model more lenient.)
"""
from __future__ import annotations

from typing import Hashable, Optional, Sequence

RECORD, WAIT, HOST_SYNC, OTHER = "record", "wait", "host_sync", "other"


def access_point(events: Sequence[tuple], stream: Hashable) -> int:
    """Index in ``events`` (``(kind, stream)`` pairs in the order the op
    issued them) before which the op's accesses on ``stream`` go."""
    for i, (kind, on) in enumerate(events):
        if kind == HOST_SYNC or (kind == RECORD and on == stream):
            return i
    return len(events)


def output_point(events: Sequence[tuple], stream: Hashable) -> int:
    """Index in ``events`` before which the writes of the op's fresh
    outputs go: right after its first host synchronisation, if any (an op
    whose output's size depends on the data, ``nonzero``, ``masked_select``,
    ``unique``..., reads its input, synchronises the host to learn the size,
    then allocates and writes the output), else with its other accesses."""
    for i, (kind, _) in enumerate(events):
        if kind == HOST_SYNC:
            return i + 1
    return access_point(events, stream)


def first_waiter(events: Sequence[tuple]) -> Optional[Hashable]:
    """The stream of the first wait inside the op: where a collective runs
    when its backend launches it on a stream of its own (the launch makes
    that stream wait for the launching one before the collective's kernels)."""
    for kind, on in events:
        if kind == WAIT:
            return on
    return None
