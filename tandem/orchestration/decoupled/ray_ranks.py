"""Data-parallel learner ranks as Ray actors (the Ray runtime with ``architecture.ray.learner_actor``).

Rank 0 is the learner actor itself. Its placement group has one bundle of ``architecture.learner``
resources per rank (:func:`~tandem.orchestration.decoupled.ray_learner.train_in_learner_actor` reserves
``world_size`` of them, strategy ``PACK``); rank ``r`` is a :class:`LearnerRankActor` in bundle ``r`` with the
same resources (so on GPUs each rank gets its own device through Ray's ``CUDA_VISIBLE_DEVICES``). The ranks
run the same :func:`~tandem.orchestration.dp_learner.rank_main` as local rank processes; they rendezvous at
rank 0's TCP store on rank 0's node address, so ranks on other nodes reach it.

Errors come back as the rank's call result: a :class:`~tandem.errors.TandemError` as its one line. The rank
actors are owned by the learner actor, so they die with it (Ray's owner fate-sharing); :meth:`close`
kills them after a normal stop.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from tandem.channels.ray import import_ray, kill_and_wait
from tandem.config.schema import TandemConfig
from tandem.errors import TandemError, first_line
from tandem.orchestration.decoupled.ray_supervisor import role_options
from tandem.orchestration.dp_learner import (
    STARTUP_TIMEOUT_S,
    LearnerRankError,
    RankProcess,
    RankSpec,
    rank_main,
)


class LearnerRankActor:
    """Actor body of ranks 1..M-1."""

    def run(self, spec: RankSpec) -> None:
        rank_main(spec)

    def describe(self) -> dict[str, Any]:
        """Where this rank runs: process id and the resources Ray assigned it."""
        resources = import_ray().get_runtime_context().get_assigned_resources()
        return {"pid": os.getpid(), "resources": dict(resources)}


class RayRank:
    """One rank actor and its running call, seen as a process (:class:`RankProcess`)."""

    def __init__(self, actor: Any, ref: Any, where: dict[str, Any]) -> None:
        self.actor, self.ref = actor, ref
        self.pid: int = int(where["pid"])
        self.resources: dict[str, float] = where["resources"]
        self._killed = False

    def _done(self, timeout: float | None = 0.0) -> bool:
        return bool(import_ray().wait([self.ref], timeout=timeout)[0])

    def is_alive(self) -> bool:
        return not self._killed and not self._done()

    @property
    def exitcode(self) -> int | None:
        if self.is_alive():
            return None
        return 0 if self.error() is None else 1

    def error(self) -> str | None:
        """The call's error once it ended with one (a TandemError as its one line), else None."""
        if self._killed or not self._done():
            return None
        ray = import_ray()
        try:
            ray.get(self.ref)
        except ray.exceptions.RayTaskError as err:
            return str(err.cause) if isinstance(err.cause, TandemError) else str(err)
        except ray.exceptions.RayActorError as err:
            return f"learner rank actor died: {first_line(err)}"
        return None

    def join(self, timeout: float | None = None) -> None:
        if not self._killed:
            self._done(timeout=timeout)

    def terminate(self) -> None:
        self.kill()

    def kill(self) -> None:
        if not self._killed:
            kill_and_wait(self.actor)
            self._killed = True


class RayRankLauncher:
    """Starts ranks 1..M-1 as actors in bundles 1..M-1 of the calling actor's placement group."""

    def __init__(self, cfg: TandemConfig) -> None:
        ray = import_ray()
        self.cfg = cfg
        self.host = ray.util.get_node_ip_address()
        self.ranks: list[RayRank] = []

    def _options(self, rank: int) -> dict[str, Any]:
        ray = import_ray()
        opts = role_options(self.cfg.architecture.learner)
        pg = ray.util.get_current_placement_group()
        if pg is not None and rank < pg.bundle_count:
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                pg, placement_group_bundle_index=rank
            )
        return opts

    def launch(self, specs: list[RankSpec]) -> list[RankProcess]:
        ray = import_ray()
        actors = [ray.remote(LearnerRankActor).options(**self._options(s.rank)).remote() for s in specs]
        try:  # before run(): an actor serves one call at a time
            places = ray.get([a.describe.remote() for a in actors], timeout=STARTUP_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            for actor in actors:
                kill_and_wait(actor)
            raise LearnerRankError(
                f"the learner rank actors did not start within {STARTUP_TIMEOUT_S:.0f} s",
                where="architecture.learner.world_size",
            ) from None
        for spec, actor, where in zip(specs, actors, places, strict=True):
            # no error queue: a rank's error is its call's result; owner fate-sharing replaces the watch
            ref = actor.run.remote(replace(spec, errors=None, watch_parent=False))
            self.ranks.append(RayRank(actor, ref, where))
        return list(self.ranks)

    def last_error(self) -> str | None:
        errors = [e for r in self.ranks if (e := r.error()) is not None]
        return errors[-1] if errors else None

    def close(self) -> None:
        for rank in self.ranks:
            rank.kill()


def in_learner_actor(cfg: TandemConfig) -> bool:
    """True inside the learner actor of a Ray run (where ranks 1..M-1 become actors too)."""
    if cfg.architecture.runtime != "ray" or not cfg.architecture.ray.learner_actor:
        return False
    ray = import_ray()
    return ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None
