"""Shared admission state between the learner and its rollout workers.

Holds the two counters of :class:`~tandem.orchestration.staleness.StalenessController` — batches issued
(tickets handed to workers) and batches consumed by the learner — plus, per worker slot, the ticket it is
generating (so a replacement of a dead worker finishes exactly that batch), a retire flag (elastic
scale-down) and a stop flag.

The rules live once, in :class:`AdmissionState`, over plain mutable integer sequences and without any
locking or waiting. Two coordinators drive it:

* :class:`Coordination` (embedded runtime, one machine): the sequences are ``multiprocessing`` shared
  memory guarded by one lock; pass the object to worker processes as an argument.
* ``RayCoordination`` (:mod:`tandem.orchestration.decoupled.ray_coordination`): the sequences are Python
  lists inside one Ray actor, which runs one call at a time, so workers on any machine share them.

Waiting workers poll (:func:`wait_for_ticket`, every ``poll_s``) instead of sleeping on a
``multiprocessing`` Condition: a Ctrl-C that interrupts the learner inside ``Condition.notify`` corrupts
the condition's internal semaphores (and then shutdown itself fails); a plain lock has no such state.
"""

from __future__ import annotations

import time
from collections.abc import Callable, MutableSequence
from multiprocessing.context import BaseContext
from typing import Any, TypeVar

from tandem.orchestration.staleness import StalenessController

MAX_SLOTS = 64  # worker slots (elastic scale-up beyond the configured num_workers)

# try_acquire results that are not tickets (tickets are >= 0)
WAIT = -1  # the staleness bound admits no new batch yet
RETIRED = -2  # the slot was asked to exit
STOPPED = -3  # the run stops

T = TypeVar("T")


class AdmissionState:
    """The admission rules over ``counters = [issued, consumed]`` and per-slot ``in_flight`` / ``retire``
    sequences. Not thread- or process-safe by itself: the owner serialises calls (a lock, or an actor)."""

    def __init__(
        self,
        controller: StalenessController,
        counters: MutableSequence[int],
        in_flight: MutableSequence[int],
        retire: MutableSequence[int],
    ) -> None:
        self.controller = controller
        self.counters, self.in_flight, self.retire_flags = counters, in_flight, retire

    @classmethod
    def in_memory(cls, controller: StalenessController, start_ticket: int = 0) -> AdmissionState:
        """State in plain Python lists (one process owns it, e.g. a Ray actor)."""
        return cls(controller, [start_ticket, start_ticket], [-1] * MAX_SLOTS, [0] * MAX_SLOTS)

    @property
    def issued(self) -> int:
        return int(self.counters[0])

    @property
    def consumed(self) -> int:
        return int(self.counters[1])

    def try_acquire(self, slot: int) -> int:
        """A ticket for ``slot`` (its dead predecessor's unfinished one first, else the next one when the
        staleness bound ``k < c + η + 1`` admits it), or :data:`RETIRED` / :data:`WAIT`."""
        if self.in_flight[slot] >= 0:  # a previous process of this slot died mid-batch
            return int(self.in_flight[slot])
        if self.retire_flags[slot]:
            return RETIRED
        ticket = int(self.counters[0])
        if not self.controller.may_start(ticket, int(self.counters[1])):
            return WAIT
        self.counters[0] = ticket + 1
        self.in_flight[slot] = ticket
        return ticket

    def done(self, slot: int) -> None:
        self.in_flight[slot] = -1

    def orphaned(self, slot: int) -> int:
        return int(self.in_flight[slot])

    def reassign(self, from_slot: int, to_slot: int) -> None:
        if self.in_flight[from_slot] >= 0 and self.in_flight[to_slot] < 0:
            self.in_flight[to_slot] = self.in_flight[from_slot]
            self.in_flight[from_slot] = -1

    def consume(self, n: int = 1) -> None:
        self.counters[1] += n

    def set_counters(self, issued: int, consumed: int) -> None:
        self.counters[0], self.counters[1] = issued, consumed

    def retire(self, slot: int, value: bool = True) -> None:
        self.retire_flags[slot] = int(value)

    def retired(self, slot: int) -> bool:
        return bool(self.retire_flags[slot])


def wait_for_ticket(
    try_once: Callable[[], int], alive: Callable[[], bool], poll_s: float = 0.005
) -> int | None:
    """Poll ``try_once`` (an :meth:`AdmissionState.try_acquire` result) until it yields a ticket; None when
    the run stops, the slot is retired or ``alive()`` turns false (checked every 50 polls)."""
    checks = 0
    while True:
        result = try_once()
        if result >= 0:
            return result
        if result in (RETIRED, STOPPED):
            return None
        checks += 1
        if checks % 50 == 0 and not alive():
            return None
        time.sleep(poll_s)


class Coordination:
    """Tickets under the staleness bound for worker processes on this machine: an :class:`AdmissionState`
    in ``multiprocessing`` shared memory behind one lock, plus a stop event."""

    def __init__(self, ctx: BaseContext, controller: StalenessController, start_ticket: int = 0) -> None:
        self.controller = controller
        self._lock = ctx.Lock()  # guards every read and write of the state below
        self._state = AdmissionState(
            controller,
            ctx.Array("q", [start_ticket, start_ticket], lock=False),
            ctx.Array("q", [-1] * MAX_SLOTS, lock=False),
            ctx.Array("b", [0] * MAX_SLOTS, lock=False),
        )
        self.stop = ctx.Event()

    def _locked(self, op: Callable[..., T], *args: Any) -> T:
        with self._lock:
            return op(*args)

    @property
    def issued(self) -> int:
        return self._locked(lambda: self._state.issued)

    @property
    def consumed(self) -> int:
        return self._locked(lambda: self._state.consumed)

    def acquire(
        self, slot: int, alive: Callable[[], bool] = lambda: True, poll_s: float = 0.005
    ) -> int | None:
        """The next ticket for worker ``slot`` (its dead predecessor's unfinished one first), or None when
        the run stops, the slot is retired or ``alive()`` turns false (the learner process died). Blocks
        (polling) while the staleness bound admits no new batch."""

        def once() -> int:
            return STOPPED if self.stop.is_set() else self._locked(self._state.try_acquire, slot)

        return wait_for_ticket(once, alive, poll_s)

    def done(self, slot: int) -> None:
        """Worker ``slot`` has put its batch on the channel."""
        self._locked(self._state.done, slot)

    def orphaned(self, slot: int) -> int:
        """The ticket slot ``slot`` was generating when it died (-1: none)."""
        return self._locked(self._state.orphaned, slot)

    def reassign(self, from_slot: int, to_slot: int) -> None:
        """Hand a retired slot's unfinished ticket to another slot."""
        self._locked(self._state.reassign, from_slot, to_slot)

    def consume(self, n: int = 1) -> None:
        """The learner consumed ``n`` batches (trained or dropped): waiting workers may start more."""
        self._locked(self._state.consume, n)

    def set_counters(self, issued: int, consumed: int) -> None:
        """Restart bookkeeping (resume): tickets below ``issued`` exist already."""
        self._locked(self._state.set_counters, issued, consumed)

    def retire(self, slot: int, value: bool = True) -> None:
        """Ask worker ``slot`` to exit after its current batch (or clear the flag for a new worker)."""
        self._locked(self._state.retire, slot, value)

    def retired(self, slot: int) -> bool:
        return self._locked(self._state.retired, slot)

    def shutdown(self) -> None:
        """Stop all workers (they finish or abandon their current batch and exit)."""
        self.stop.set()
