"""The typed seams of a decoupled run, besides the two channels (``tandem.channels.base``:
:class:`~tandem.channels.base.TrajectoryChannel`, :class:`~tandem.channels.base.WeightChannel`):

* :class:`Admission` — tickets under the staleness bound: workers ``acquire`` one per batch, the learner
  ``consume``s. Implementations: :class:`~tandem.orchestration.decoupled.coordination.Coordination` (shared
  memory on one machine), :class:`~tandem.orchestration.decoupled.ray_coordination.RayCoordination` (an
  actor). The rules are one :class:`~tandem.orchestration.decoupled.coordination.AdmissionState`.
* :class:`WorkerSupervisor` — starts, restarts, scales and stops the rollout workers. Implementations:
  :class:`~tandem.orchestration.decoupled.supervisor.LocalSupervisor` (processes),
  :class:`~tandem.orchestration.decoupled.ray_supervisor.RaySupervisor` (actors).

``architecture.runtime`` chooses one implementation of each (:mod:`~tandem.orchestration.decoupled.backends`);
the learner, the workers and the loop see only these protocols.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from tandem.orchestration.staleness import StalenessController


class StopFlag(Protocol):
    """The run-wide stop signal (a multiprocessing Event, or a flag in the admission actor)."""

    def is_set(self) -> bool: ...

    def set(self) -> None: ...


@runtime_checkable
class Admission(Protocol):
    """Admission and staleness control shared by the learner and its workers (picklable to workers)."""

    controller: StalenessController
    stop: StopFlag

    @property
    def issued(self) -> int:
        """Tickets handed out so far."""
        ...

    @property
    def consumed(self) -> int:
        """Batches the learner consumed (trained or dropped)."""
        ...

    def acquire(self, slot: int, alive: Callable[[], bool] = ..., poll_s: float = ...) -> int | None:
        """The next ticket for worker ``slot`` (its dead predecessor's unfinished one first), waiting while
        the staleness bound admits none; None when the run stops, the slot retires or ``alive()`` fails."""
        ...

    def done(self, slot: int) -> None:
        """Worker ``slot`` has put its batch on the channel."""
        ...

    def orphaned(self, slot: int) -> int:
        """The ticket slot ``slot`` was generating when it died (-1: none)."""
        ...

    def reassign(self, from_slot: int, to_slot: int) -> None:
        """Hand a retired slot's unfinished ticket to another slot."""
        ...

    def consume(self, n: int = 1) -> None:
        """The learner consumed ``n`` batches: waiting workers may start more."""
        ...

    def set_counters(self, issued: int, consumed: int) -> None:
        """Restart bookkeeping (resume): tickets below ``issued`` exist already."""
        ...

    def retire(self, slot: int, value: bool = True) -> None:
        """Ask worker ``slot`` to exit after its current batch (or clear the flag for a new worker)."""
        ...

    def retired(self, slot: int) -> bool: ...

    def shutdown(self) -> None:
        """Stop every worker (they finish or abandon their batch and exit)."""
        ...


@runtime_checkable
class WorkerSupervisor(Protocol):
    """Owns the rollout workers of one run: start, restart the dead, scale up and down, stop."""

    total_restarts: int

    def start(self, num_workers: int) -> None: ...

    def add_worker(self) -> int:
        """Start one more worker (elastic scale-up); returns its slot."""
        ...

    def remove_worker(self, slot: int | None = None) -> int:
        """Retire one worker (elastic scale-down) after its current batch; returns its slot."""
        ...

    @property
    def num_alive(self) -> int: ...

    @property
    def num_active(self) -> int:
        """Live workers that are not retiring (what elastic scaling counts)."""
        ...

    def poll(self) -> None:
        """Restart dead workers; raise :class:`~tandem.orchestration.decoupled.supervisor.WorkerFailedError`
        on a user error or too many restarts (the learner calls it while it waits for data)."""
        ...

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop every worker: ask, wait, then terminate stragglers."""
        ...

    def pids(self) -> list[int]:
        """Process ids of the workers."""
        ...
