"""The comparable form of a finding on a schedule: a tuple of step indices.

The model's findings (converted by the runner) and the oracle's are both
reduced to these, so two independent implementations can be compared with
``==`` on sorted lists.  Sites are step indices; storages are named by the
index of the step that allocated them; ``None`` as a free step means "a
free right now", reported by a flush for a storage still alive.
"""
from __future__ import annotations

from typing import Optional


def race(access_step: int, prior_step: int) -> tuple:
    return ("data_race", access_step, prior_step)


def uncovered_free(
    free_step: Optional[int], storage: int, usage_stream: int, last_use_step: int
) -> tuple:
    return ("uncovered_free", free_step, storage, usage_stream, last_use_step)


def reuse_race(
    access_step: int, storage: int, previous: int, usage_stream: int, previous_use_step: int
) -> tuple:
    return ("reuse_race", access_step, storage, previous, usage_stream, previous_use_step)


def invalid_free(step: int, reason: str) -> tuple:
    return ("invalid_free", step, reason)


def use_after_free(step: int, storage: int) -> tuple:
    return ("use_after_free", step, storage)


def unrecorded_event_wait(step: int) -> tuple:
    return ("unrecorded_event_wait", step)


def sort(keys) -> list:
    """Keys in a stable order (``None`` free steps, i.e. flush findings, last)."""
    return sorted(keys, key=lambda k: tuple((x is None, x if x is not None else 0) for x in k))
