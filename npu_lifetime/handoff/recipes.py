"""Ways to hand a buffer from the stream that allocated it (its owner) to a
consumer stream and free it safely, as FSDP-style code does for all-gather
outputs and reduce-scatter inputs.

* ``EventStash``: the hand-rolled recipe (FSDP2 repeats it for all-gather,
  reduce-scatter and all-reduce state): record an event on the consumer
  right after the last use, keep a reference in a stash, and later, with the
  owner stream current, make it wait on the event and drop the reference.
  Every step is load-bearing.
* ``record_use``: one call after the last use; drop the reference anywhere.
* ``record_stream``: one call; the free waits for everything queued on the
  consumer at free time, not at the last use, so memory is held longer.

Each strategy below plugs into the hand-off harness (``harness.py``)
through four hooks; the ``broken_*`` ones are the recipe's classic
mistakes, kept to show what the sanitizer and the measurements say of them.
"""
from __future__ import annotations


class EventStash:
    """The hand-rolled recipe as a helper, for any ``device`` module with
    ``Event`` and ``current_stream`` (``torch.cuda``, ``torch.npu``,
    ``npu_lifetime.simdevice``).

        stash.hold(buf, consumer)   # right after the consumer's last use of buf
        del buf                     # the stash keeps it alive
        ...
        with stream(owner):         # later, before the owner reuses memory
            stash.release()
    """

    def __init__(self, device) -> None:
        self.device = device
        self._entries: list = []

    def hold(self, tensor, consumer, event=None) -> None:
        if event is None:
            event = self.device.Event()
            event.record(consumer)
        self._entries.append((tensor, event))

    def release(self) -> None:
        """Makes the *current* stream wait on every held event, then drops
        the references: run it with the owner stream current."""
        current = self.device.current_stream()
        for _, event in self._entries:
            current.wait_event(event)
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


class Handoff:
    """Hooks the harness calls around each buffer's last use and free."""

    name = "none"

    def __init__(self, device) -> None:
        self.device = device

    def before_last_use(self, buf, consumer) -> None:
        pass

    def after_last_use(self, buf, consumer) -> None:
        pass

    def drop(self, buf, owner, consumer) -> None:
        """The schedule is done with ``buf`` (its reference goes after this)."""

    def before_alloc(self, owner) -> None:
        """The owner is about to allocate again."""


class RecordStreamHandoff(Handoff):
    name = "record_stream"

    def after_last_use(self, buf, consumer) -> None:
        self.device.record_stream(buf, consumer)


class RecordUseHandoff(Handoff):
    name = "record_use"

    def after_last_use(self, buf, consumer) -> None:
        self.device.record_use(buf, consumer)


class RecipeHandoff(Handoff):
    """FSDP2's recipe: one stash per owner stream."""

    name = "recipe"

    def __init__(self, device) -> None:
        super().__init__(device)
        self.stashes: dict = {}
        self.events: dict = {}

    def _stash(self, owner) -> EventStash:
        return self.stashes.setdefault(owner, EventStash(self.device))

    def after_last_use(self, buf, consumer) -> None:
        event = self.device.Event()
        event.record(consumer)
        self.events[id(buf)] = event

    def drop(self, buf, owner, consumer) -> None:
        self._stash(owner).hold(buf, consumer, self.events.pop(id(buf)))

    def before_alloc(self, owner) -> None:
        with self.device.stream(owner):
            self._stash(owner).release()


class BrokenDropOutsideOwnerStream(RecipeHandoff):
    """The stash is released with the consumer stream current: the wait
    lands on the wrong stream and the owner never waits."""

    name = "broken: drop outside the owner stream context"

    def __init__(self, device) -> None:
        super().__init__(device)
        self.consumers: dict = {}

    def drop(self, buf, owner, consumer) -> None:
        self.consumers[owner] = consumer
        super().drop(buf, owner, consumer)

    def before_alloc(self, owner) -> None:
        with self.device.stream(self.consumers.get(owner, owner)):
            self._stash(owner).release()


class BrokenEventTooLate(RecipeHandoff):
    """The consumer event is recorded at the drop, after unrelated consumer
    work: still safe, but the owner waits for more than it needs
    (over-reserving)."""

    name = "inefficient: consumer event recorded late"

    def after_last_use(self, buf, consumer) -> None:
        pass

    def drop(self, buf, owner, consumer) -> None:
        self._stash(owner).hold(buf, consumer)


class BrokenStashDroppedEarly(RecipeHandoff):
    """The event is recorded but the reference is dropped at once: nothing
    keeps the owner from reusing the memory."""

    name = "broken: stash dropped too early"

    def drop(self, buf, owner, consumer) -> None:
        self.events.pop(id(buf), None)


class BrokenRecordUseBeforeLastRead(Handoff):
    """record_use is called before the consumer's last read, which it
    therefore does not cover."""

    name = "broken: record_use before the last read"

    def before_last_use(self, buf, consumer) -> None:
        self.device.record_use(buf, consumer)


CORRECT = (RecordStreamHandoff, RecipeHandoff, RecordUseHandoff)
BROKEN = (BrokenDropOutsideOwnerStream, BrokenEventTooLate, BrokenStashDroppedEarly, BrokenRecordUseBeforeLastRead)
