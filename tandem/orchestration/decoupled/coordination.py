"""Shared admission state between the learner and its rollout workers (one machine, any process).

Holds the two counters of :class:`~tandem.orchestration.staleness.StalenessController` — batches issued
(tickets handed to workers) and batches consumed by the learner — plus, per worker slot, the ticket it is
generating (so a replacement of a dead worker finishes exactly that batch), a retire flag (elastic
scale-down) and a stop event. Everything is ``multiprocessing`` primitives; pass the object to worker
processes as an argument.

Waiting workers poll (every ``poll_s``, default 5 ms) instead of sleeping on a ``multiprocessing``
Condition: a Ctrl-C that interrupts the learner inside ``Condition.notify`` corrupts the condition's
internal semaphores (and then shutdown itself fails); a plain lock has no such state.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from multiprocessing.context import BaseContext

from tandem.orchestration.staleness import StalenessController

MAX_SLOTS = 64  # worker slots (elastic scale-up beyond the configured num_workers)


class Coordination:
    """Tickets under the staleness bound: ``acquire`` blocks a worker until ``k < c + η + 1``."""

    def __init__(self, ctx: BaseContext, controller: StalenessController, start_ticket: int = 0) -> None:
        self.controller = controller
        self._lock = ctx.Lock()  # guards the counters and per-slot arrays below
        self._issued = ctx.Value("q", start_ticket, lock=False)
        self._consumed = ctx.Value("q", start_ticket, lock=False)
        self._in_flight = ctx.Array("q", [-1] * MAX_SLOTS, lock=False)
        self._retire = ctx.Array("b", [0] * MAX_SLOTS, lock=False)
        self.stop = ctx.Event()

    @property
    def issued(self) -> int:
        with self._lock:
            return int(self._issued.value)

    @property
    def consumed(self) -> int:
        with self._lock:
            return int(self._consumed.value)

    def acquire(
        self, slot: int, alive: Callable[[], bool] = lambda: True, poll_s: float = 0.005
    ) -> int | None:
        """The next ticket for worker ``slot`` (its dead predecessor's unfinished one first), or None when
        the run stops, the slot is retired or ``alive()`` turns false (the learner process died). Blocks
        (polling) while the staleness bound admits no new batch."""
        checks = 0
        while not self.stop.is_set():
            with self._lock:
                if self._in_flight[slot] >= 0:  # a previous process of this slot died mid-batch
                    return int(self._in_flight[slot])
                if self._retire[slot]:
                    return None
                ticket = int(self._issued.value)
                if self.controller.may_start(ticket, int(self._consumed.value)):
                    self._issued.value = ticket + 1
                    self._in_flight[slot] = ticket
                    return ticket
            checks += 1
            if checks % 50 == 0 and not alive():
                return None
            time.sleep(poll_s)
        return None

    def done(self, slot: int) -> None:
        """Worker ``slot`` has put its batch on the channel."""
        with self._lock:
            self._in_flight[slot] = -1

    def orphaned(self, slot: int) -> int:
        """The ticket slot ``slot`` was generating when it died (-1: none)."""
        with self._lock:
            return int(self._in_flight[slot])

    def reassign(self, from_slot: int, to_slot: int) -> None:
        """Hand a retired slot's unfinished ticket to another slot."""
        with self._lock:
            if self._in_flight[from_slot] >= 0 and self._in_flight[to_slot] < 0:
                self._in_flight[to_slot] = self._in_flight[from_slot]
                self._in_flight[from_slot] = -1

    def consume(self, n: int = 1) -> None:
        """The learner consumed ``n`` batches (trained or dropped): waiting workers may start more."""
        with self._lock:
            self._consumed.value += n

    def set_counters(self, issued: int, consumed: int) -> None:
        """Restart bookkeeping (resume): tickets below ``issued`` exist already."""
        with self._lock:
            self._issued.value, self._consumed.value = issued, consumed

    def retire(self, slot: int, value: bool = True) -> None:
        """Ask worker ``slot`` to exit after its current batch (or clear the flag for a new worker)."""
        with self._lock:
            self._retire[slot] = int(value)

    def retired(self, slot: int) -> bool:
        with self._lock:
            return bool(self._retire[slot])

    def shutdown(self) -> None:
        """Stop all workers (they finish or abandon their current batch and exit)."""
        self.stop.set()
