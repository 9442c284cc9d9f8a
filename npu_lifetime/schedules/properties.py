"""The properties the lifetime model must have on every schedule, each a
function that returns ``None`` when it holds and a description otherwise.
The tests state them with hypothesis; ``npu-lifetime fuzz`` runs them at
volume."""
from __future__ import annotations

from typing import Optional

from .compare import compare
from .executor import delay_stream, execute, random_order
from .runner import run_model
from .schedule import Op, Read, Schedule, Write


def oracle_disagreement(schedule: Schedule) -> Optional[str]:
    """The model's findings must equal the oracle's."""
    comparison = compare(schedule)
    return None if comparison.agree else str(comparison)


def _free_time_uncovered(found: list) -> list:
    return [k for k in found if k[0] == "uncovered_free" and k[1] is not None]


def executor_violation(schedule: Schedule, seed: int = 0) -> Optional[str]:
    """Checks the model's verdicts against the simulated device:

    * a free the model calls covered is never followed by a use of the freed
      storage, in random orders and with each stream run as late as possible;
    * for a free it calls uncovered, running the usage stream as late as the
      dependencies allow makes the last uncovered use run after the reuse;
    * with no data race and no uncovered free, no access ever finds another
      storage's data in its cells;
    * for a reuse race by a writing new owner, running the previous use's
      stream as late as the dependencies allow makes an access of the
      previous or the new owner find the other's data in its cells: the
      corruption the race names.  (Not necessarily the named use itself:
      another racing use of the previous owner may run first and be the one
      to clobber or see the new owner's data.)
    """
    found = run_model(schedule)
    uncovered = _free_time_uncovered(found)
    orders = [random_order(seed)] + [delay_stream(s) for s in range(schedule.streams)]
    runs = [execute(schedule, order) for order in orders]
    allowed = {k[2] for k in uncovered}
    for run in runs:
        wrong = set(run.corrupted) - allowed
        if wrong:
            return f"storages {sorted(wrong)} were reused under a live use, yet their frees were called covered"
    for _, free_step, storage, stream, last_use in uncovered:
        late = execute(schedule, delay_stream(stream), allocator_waits=False)
        if last_use not in late.corrupted.get(storage, []):
            return (
                f"free at step {free_step} was called uncovered for stream {stream}, "
                f"but running stream {stream} last did not corrupt step {last_use}"
            )
    if not uncovered and not any(k[0] == "data_race" for k in found):
        for run in runs:
            if run.foreign:
                return f"no findings, yet accesses saw foreign data: {run.foreign}"
    for _, step, storage, previous, stream, previous_use in (k for k in found if k[0] == "reuse_race"):
        if not _writes(schedule, step, storage):
            continue
        late = execute(schedule, delay_stream(stream), allocator_waits=False)
        uses = _uses_of(schedule, previous) | _uses_of(schedule, storage)
        if not uses & {seen_at for seen_at, _ in late.foreign}:
            return (
                f"reuse race at step {step} with the use at step {previous_use} on stream {stream}, "
                "but running that stream last did not make the use see foreign data"
            )
    return None


def _writes(schedule: Schedule, step: int, storage: int) -> bool:
    """Whether the access at ``step`` (to ``storage``, named by its
    allocation step) was a write."""
    s = schedule.steps[step]
    if isinstance(s, Write):
        return True
    if isinstance(s, Op):
        roots = _roots(schedule, step)
        return any(roots[t] == storage for t in s.writes)
    return False


def _uses_of(schedule: Schedule, storage: int) -> set:
    """Steps that access ``storage``."""
    roots = _roots(schedule, len(schedule.steps))
    out = set()
    for i, s in enumerate(schedule.steps):
        tensors = (*s.reads, *s.writes) if isinstance(s, Op) else (getattr(s, "tensor", None),)
        if isinstance(s, (Op, Read, Write)) and any(roots.get(t) == storage for t in tensors):
            out.add(i)
    return out


def _roots(schedule: Schedule, upto: int) -> dict:
    """Tensor -> the allocation step of its storage, for steps before ``upto``."""
    roots: dict = {}
    for i, s in enumerate(schedule.steps[:upto]):
        if hasattr(s, "base"):
            roots[s.tensor] = roots[s.base]
        elif hasattr(s, "address"):
            roots[s.tensor] = i
    return roots
