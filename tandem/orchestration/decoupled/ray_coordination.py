"""Admission state for rollout workers that are Ray actors, possibly on other machines.

The same :class:`~tandem.orchestration.decoupled.coordination.AdmissionState` as the embedded runtime, held
in one small Ray actor (``num_cpus=0``, pinned to the driver's node, so the learner's ``consume`` is a
local round trip). An actor executes one call at a time, which is all the mutual exclusion the state
needs. :class:`RayCoordination` is the picklable client with the public interface of
:class:`~tandem.orchestration.decoupled.coordination.Coordination`; pass it to worker actors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tandem.channels.ray import driver_node_strategy, import_ray
from tandem.orchestration.decoupled.coordination import STOPPED, AdmissionState, wait_for_ticket
from tandem.orchestration.staleness import StalenessController


class CoordinatorActor:
    """Actor body: an in-memory :class:`AdmissionState` and a stop flag."""

    def __init__(self, controller: StalenessController, start_ticket: int = 0) -> None:
        self.state = AdmissionState.in_memory(controller, start_ticket)
        self.stopped = False

    def try_acquire(self, slot: int) -> int:
        return STOPPED if self.stopped else self.state.try_acquire(slot)

    def call(self, method: str, *args: Any) -> Any:
        """Run one :class:`AdmissionState` operation (done, orphaned, reassign, consume, ...)."""
        return getattr(self.state, method)(*args)

    def counters(self) -> tuple[int, int]:
        return self.state.issued, self.state.consumed

    def stop(self) -> None:
        self.stopped = True

    def is_stopped(self) -> bool:
        return self.stopped


class _RemoteStop:
    """``coord.stop`` with the ``is_set``/``set`` interface of the embedded coordinator's event."""

    def __init__(self, actor: Any) -> None:
        self._actor = actor

    def is_set(self) -> bool:
        return bool(import_ray().get(self._actor.is_stopped.remote()))

    def set(self) -> None:
        import_ray().get(self._actor.stop.remote())


class RayCoordination:
    """Client of a :class:`CoordinatorActor`; same methods as the embedded ``Coordination``."""

    def __init__(self, controller: StalenessController, start_ticket: int = 0) -> None:
        ray = import_ray()
        self.controller = controller
        self._actor = (
            ray.remote(CoordinatorActor)
            .options(num_cpus=0, scheduling_strategy=driver_node_strategy())
            .remote(controller, start_ticket)
        )
        self.stop = _RemoteStop(self._actor)

    def _call(self, method: str, *args: Any) -> Any:
        return import_ray().get(self._actor.call.remote(method, *args))

    @property
    def issued(self) -> int:
        return int(import_ray().get(self._actor.counters.remote())[0])

    @property
    def consumed(self) -> int:
        return int(import_ray().get(self._actor.counters.remote())[1])

    def acquire(
        self, slot: int, alive: Callable[[], bool] = lambda: True, poll_s: float = 0.02
    ) -> int | None:
        """As ``Coordination.acquire``; polls the actor every ``poll_s`` (a remote call, so less often)."""
        ray = import_ray()
        return wait_for_ticket(lambda: int(ray.get(self._actor.try_acquire.remote(slot))), alive, poll_s)

    def done(self, slot: int) -> None:
        self._call("done", slot)

    def orphaned(self, slot: int) -> int:
        return int(self._call("orphaned", slot))

    def reassign(self, from_slot: int, to_slot: int) -> None:
        self._call("reassign", from_slot, to_slot)

    def consume(self, n: int = 1) -> None:
        self._call("consume", n)

    def set_counters(self, issued: int, consumed: int) -> None:
        self._call("set_counters", issued, consumed)

    def retire(self, slot: int, value: bool = True) -> None:
        self._call("retire", slot, value)

    def retired(self, slot: int) -> bool:
        return bool(self._call("retired", slot))

    def shutdown(self) -> None:
        self.stop.set()

    def close(self) -> None:
        """Free the actor (the driver, at the end of the run)."""
        import_ray().kill(self._actor)
