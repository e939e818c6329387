"""Rollout workers as Ray actors: placement, start, restart, scale up and down, stop.

Each worker slot is one actor (:class:`RolloutActor`) created with the role's resources
(``architecture.worker.cpus/gpus/memory_mb`` -> ``num_cpus/num_gpus/memory``) and
``max_restarts=architecture.max_worker_restarts``; its ``run`` method is the same worker loop as a worker
process of the embedded runtime (:func:`~tandem.orchestration.decoupled.worker.run_worker`).

Placement: one placement group with a bundle per configured worker plus one learner bundle
(``architecture.learner.*``) pinned to the driver's node — the learner runs in the driver process (rank 0),
so its bundle reserves its CPUs/GPUs there and the workers cannot oversubscribe them. When the learner is
itself a Ray actor (``architecture.ray.learner_actor``, :mod:`~tandem.orchestration.decoupled.ray_learner`)
the actor already holds those resources, so the group has the worker bundles only. Workers added later
(elastic scale-up) beyond the group's bundles are ordinary actors with the same resources.

Faults mirror :class:`~tandem.orchestration.decoupled.supervisor.LocalSupervisor`: when a worker's process
dies, Ray restarts the actor (``max_restarts``) and its pending ``run`` fails with
``ActorUnavailableError``; :meth:`RaySupervisor.poll` submits ``run`` again (again while the actor is
still restarting), and the replacement first finishes the ticket its predecessor was generating (the
coordination keeps it in flight). A restart is counted when a slot's actor answers from a new process id.
Once Ray gives up (``ActorDiedError``: more than ``max_worker_restarts`` deaths) the run stops. An exception
in the loop (the process survives) is counted as a restart of the loop, bounded the same way. A user error
(:class:`~tandem.errors.TandemError`) is returned as its one line and stops the run.
"""

from __future__ import annotations

import logging
import os
import uuid
from typing import Any

import torch

from tandem.channels.base import TrajectoryChannel, WeightChannel
from tandem.channels.ray import import_ray
from tandem.config.schema import RoleResources, TandemConfig
from tandem.errors import ConfigError, TandemError, first_line
from tandem.orchestration.decoupled.coordination import MAX_SLOTS
from tandem.orchestration.decoupled.ray_coordination import RayCoordination
from tandem.orchestration.decoupled.supervisor import WorkerFailedError
from tandem.orchestration.decoupled.worker import WorkerSpec, run_worker

log = logging.getLogger(__name__)

PLACEMENT_TIMEOUT_S = 120.0  # a joined cluster may need to scale up first


class RolloutActor:
    """Actor body of one worker slot. Two concurrent calls, so ``pid``/``assigned_resources`` answer while
    ``run`` works."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec

    def run(self) -> str | None:
        """The worker loop until the run stops or the slot retires; the one-line error on a user error."""
        spec = self.spec
        torch.set_num_threads(spec.cfg.architecture.worker.threads)
        try:
            run_worker(spec, alive=lambda: True)  # Ray ends the actors of a driver that dies
        except TandemError as err:
            return f"rollout worker {spec.slot}: {err}"
        finally:
            spec.channel.close()
            spec.weights.close()
        return None

    def pid(self) -> int:
        return os.getpid()

    def assigned_resources(self) -> dict[str, float]:
        return dict(import_ray().get_runtime_context().get_assigned_resources())


def role_resources(role: RoleResources) -> dict[str, float]:
    """Ray resource amounts of one process of a role (zero amounts left out)."""
    res = {"CPU": float(role.cpus), "GPU": float(role.gpus)}
    if role.memory_mb is not None:
        res["memory"] = float(role.memory_mb * 2**20)
    return {k: v for k, v in res.items() if v > 0}


def role_options(role: RoleResources, max_restarts: int = 0) -> dict[str, Any]:
    """Ray actor options of one process of a role: ``num_cpus``, ``num_gpus``, ``memory`` (bytes)."""
    opts: dict[str, Any] = {"num_cpus": role.cpus, "num_gpus": role.gpus, "max_restarts": max_restarts}
    if role.memory_mb is not None:
        opts["memory"] = role.memory_mb * 2**20
    return opts


def _driver_node_ip(ray: Any) -> str:
    node_id = ray.get_runtime_context().get_node_id()
    return next(n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == node_id)


class RaySupervisor:
    """Owns the rollout actors (and the placement group) of one decoupled run on a Ray cluster."""

    def __init__(
        self,
        cfg: TandemConfig,
        channel: TrajectoryChannel,
        weights: WeightChannel,
        coord: RayCoordination,
        placement_timeout_s: float = PLACEMENT_TIMEOUT_S,
    ) -> None:
        self.cfg, self.placement_timeout_s = cfg, placement_timeout_s
        self.channel, self.weights, self.coord = channel, weights, coord
        self.actors: dict[int, Any] = {}
        self.runs: dict[int, Any] = {}  # slot -> ObjectRef of the running run()
        self.restarts: dict[int, int] = {}
        self.total_restarts = 0
        self._pids: dict[int, int] = {}  # slot -> process id of its actor, as last seen
        self._pid_refs: dict[int, Any] = {}  # slot -> pending pid() answer
        self.placement_group: Any = None
        self._worker_bundles = 0  # the first bundles of the group are the workers'
        self._run_id = uuid.uuid4().hex[:8]  # actor names stay unique on a shared cluster

    # -- placement -----------------------------------------------------------------------------------------
    def _reserve(self, num_workers: int) -> None:
        """One bundle per worker + the learner's bundle on the driver's node (none when this process is an
        actor: its resources are reserved already); wait until Ray grants the group."""
        ray = import_ray()
        from ray.util.placement_group import placement_group

        arch = self.cfg.architecture
        worker = role_resources(arch.worker)
        if not worker:  # Ray cannot reserve an empty bundle: nothing to place
            return
        bundles = [worker] * num_workers
        in_actor = ray.get_runtime_context().get_actor_id() is not None
        if not in_actor:
            bundles.append({**role_resources(arch.learner), f"node:{_driver_node_ip(ray)}": 0.001})
        pg = placement_group(bundles, strategy="PACK")
        ready, _ = ray.wait([pg.ready()], timeout=self.placement_timeout_s)
        if not ready:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(pg)
            learner_part = "" if in_actor else f" plus the learner's {role_resources(arch.learner)}"
            raise ConfigError(
                f"the Ray cluster cannot reserve {num_workers} rollout worker(s) of {worker}{learner_part} "
                f"within {self.placement_timeout_s:.0f} s "
                f"(cluster: {ray.cluster_resources()})",
                where="architecture.worker.cpus",
                hint="lower architecture.worker/learner resources or num_workers, or add nodes "
                "(architecture.ray.num_cpus for a local instance)",
            )
        self.placement_group, self._worker_bundles = pg, num_workers

    def _options(self, slot: int) -> dict[str, Any]:
        arch = self.cfg.architecture
        opts = role_options(arch.worker, arch.max_worker_restarts)
        opts.update(max_concurrency=2, name=f"tandem-rollout-{self._run_id}-{slot}")
        pg = self.placement_group
        if pg is not None and slot < self._worker_bundles:  # beyond them: the learner's bundle, or none
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                pg, placement_group_bundle_index=slot
            )
        return opts

    # -- lifecycle -----------------------------------------------------------------------------------------
    def _spawn(self, slot: int) -> None:
        ray = import_ray()
        spec = WorkerSpec(slot, self.cfg, self.channel, self.weights, self.coord)
        actor = ray.remote(RolloutActor).options(**self._options(slot)).remote(spec)
        self.actors[slot] = actor
        self._submit(slot)

    def _submit(self, slot: int) -> None:
        """(Re)start the loop of ``slot`` and ask its process id (to notice a restarted actor)."""
        actor = self.actors[slot]
        self._pid_refs[slot] = actor.pid.remote()
        self.runs[slot] = actor.run.remote()

    def start(self, num_workers: int) -> None:
        self._reserve(num_workers)
        for _ in range(num_workers):
            self.add_worker()

    def add_worker(self) -> int:
        """Start one more rollout actor (elastic scale-up); returns its slot."""
        slot = next(s for s in range(MAX_SLOTS) if s not in self.actors)
        self.coord.retire(slot, False)
        self.restarts[slot] = 0
        self._pids.pop(slot, None)
        self._spawn(slot)
        return slot

    def remove_worker(self, slot: int | None = None) -> int:
        """Retire one worker (elastic scale-down): it finishes its current batch and its ``run`` returns."""
        live = [s for s in self._running() if not self.coord.retired(s)]
        if len(live) <= 1:
            raise WorkerFailedError("cannot remove the last rollout worker", where="architecture.num_workers")
        slot = live[-1] if slot is None else slot
        self.coord.retire(slot)
        return slot

    def _running(self) -> list[int]:
        """Slots whose ``run`` has not returned (or failed) yet."""
        if not self.runs:
            return []
        refs = list(self.runs.values())
        _, pending = import_ray().wait(refs, num_returns=len(refs), timeout=0)
        pending_ids = {r.hex() for r in pending}
        return [s for s, r in self.runs.items() if r.hex() in pending_ids]

    @property
    def num_alive(self) -> int:
        return len(self._running())

    @property
    def num_active(self) -> int:
        """Live workers that are not retiring (what elastic scaling counts)."""
        return sum(not self.coord.retired(s) for s in self._running())

    def poll(self) -> None:
        """Resubmit the run of dead or restarting workers; raise :class:`WorkerFailedError` on a user error
        or when a slot died more than ``max_worker_restarts`` times."""
        from ray import exceptions

        # Ray < 2.2x has no ActorUnavailableError: every actor error then counts as one restart here
        unavailable = getattr(exceptions, "ActorUnavailableError", None)
        self._count_restarts()
        running = set(self._running())
        for slot in [s for s in self.runs if s not in running]:
            if self.coord.stop.is_set():
                return
            try:
                user_error = import_ray().get(self.runs[slot])
            except exceptions.RayActorError as err:
                if unavailable is not None and isinstance(err, unavailable):  # Ray is restarting it
                    self._submit(slot)
                    continue
                if unavailable is None:
                    self._restart_loop(slot, f"actor died: {first_line(err)}")
                    continue
                raise WorkerFailedError(  # Ray gave up: restarts exhausted
                    f"rollout worker {slot} died more than {self.cfg.architecture.max_worker_restarts} times "
                    f"({first_line(err)})",
                    where="architecture.max_worker_restarts",
                ) from None
            except exceptions.RayTaskError as err:  # an exception in the loop; the process lives on
                self._restart_loop(slot, f"crashed: {str(err).strip().splitlines()[-1]}")
                continue
            if user_error is not None:
                raise WorkerFailedError(user_error)
            if self.coord.retired(slot):
                self._reap_retired(slot)
            else:
                self._restart_loop(slot, "its loop ended")

    def _restart_loop(self, slot: int, reason: str) -> None:
        if self.restarts[slot] >= self.cfg.architecture.max_worker_restarts:
            raise WorkerFailedError(
                f"rollout worker {slot} failed {self.restarts[slot] + 1} times; last: {reason}",
                where="architecture.max_worker_restarts",
            )
        self.restarts[slot] += 1
        self.total_restarts += 1
        log.warning("rollout worker %d %s; restarting it", slot, reason)
        self._submit(slot)

    def _count_restarts(self) -> None:
        """A slot whose actor answers from a new process id was restarted by Ray: count it."""
        from ray.exceptions import RayError

        ray = import_ray()
        for slot, ref in list(self._pid_refs.items()):
            if not ray.wait([ref], timeout=0)[0]:
                continue
            del self._pid_refs[slot]
            try:
                pid = int(ray.get(ref))
            except RayError:  # still restarting: the next _submit asks again
                continue
            old = self._pids.get(slot)
            self._pids[slot] = pid
            if old is not None and old != pid:
                self.restarts[slot] += 1
                self.total_restarts += 1
                log.warning("rollout worker %d was restarted by Ray (process %d -> %d)", slot, old, pid)

    def _reap_retired(self, slot: int) -> None:
        """A retired worker returned: hand any unfinished ticket to a live worker, free its actor."""
        del self.runs[slot]
        self._pid_refs.pop(slot, None)
        import_ray().kill(self.actors.pop(slot))
        if self.coord.orphaned(slot) >= 0:
            live = [s for s in self._running() if not self.coord.retired(s)]
            if live:
                self.coord.reassign(slot, live[0])

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop every worker: ask, wait up to ``timeout`` seconds for their runs, then kill the actors and
        free the placement group."""
        ray = import_ray()
        try:
            self.coord.shutdown()
            refs = list(self.runs.values())
            if refs:
                ray.wait(refs, num_returns=len(refs), timeout=timeout)
        finally:
            for actor in self.actors.values():
                ray.kill(actor, no_restart=True)
            self.actors.clear()
            self.runs.clear()
            self._pid_refs.clear()
            if self.placement_group is not None:
                from ray.util.placement_group import remove_placement_group

                remove_placement_group(self.placement_group)
                self.placement_group, self._worker_bundles = None, 0

    def pids(self) -> list[int]:
        """Process ids of the worker actors (waits for a restarting actor to come back)."""
        ray = import_ray()
        return [int(ray.get(a.pid.remote(), timeout=60)) for a in self.actors.values()]

    def assigned_resources(self) -> dict[int, dict[str, float]]:
        """Per slot, the resources Ray assigned to the worker's actor."""
        ray = import_ray()
        return {s: ray.get(a.assigned_resources.remote(), timeout=60) for s, a in self.actors.items()}
