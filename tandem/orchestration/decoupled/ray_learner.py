"""The learner of a Ray run as a Ray actor (``architecture.ray.learner_actor: true``).

The driver (the process running ``tandem train``) joins or starts the cluster (:class:`RayCluster`),
reserves one placement-group bundle of ``architecture.learner.cpus/gpus/memory_mb`` (strategy
``STRICT_PACK``), creates one :class:`LearnerActor` in it with those resources, and calls its ``train``,
which runs the ordinary :func:`~tandem.orchestration.decoupled.runtime.train_decoupled` inside the actor.
There Ray is already initialised, so the run's ``RayCluster`` takes its "reused" path; the actor creates
the admission, weight and queue actors (pinned to its own node) and the rollout workers, whose placement
group then has the worker bundles only (the learner's resources are the actor's). On a 2-CPU local
instance ``learner.cpus: 1`` + one worker of ``worker.cpus: 1`` fill it exactly.

The run folder, checkpoints and metrics are written by the actor, on its node: the same filesystem on a
single-node cluster or a local instance; on a multi-node cluster ``run.output_dir`` must be shared storage
mounted at the same path (checkpoints are local paths, not URLs).

The driver waits in short ``ray.wait`` polls, so Ctrl-C reaches it. On Ctrl-C it cancels the call (a flag
the actor checks after each step; it then stops as an interrupted driver would: its ``finally`` blocks
stop the workers and free their placement group), waits up to :data:`STOP_GRACE_S`, then kills the actor;
the actors it owns die with it (Ray's owner fate-sharing). A :class:`~tandem.errors.TandemError` raised in
the actor reaches the driver as itself (one line), not as Ray's wrapper with the remote traceback.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from tandem.channels.ray import import_ray
from tandem.config.schema import TandemConfig
from tandem.errors import ConfigError, TandemError
from tandem.orchestration.decoupled.ray_cluster import RayCluster
from tandem.orchestration.decoupled.ray_supervisor import role_options, role_resources
from tandem.orchestration.decoupled.runtime import RunHooks, train_decoupled
from tandem.orchestration.runner import RunResult

log = logging.getLogger(__name__)

POLL_S = 0.5  # the driver returns to Python this often, so a Ctrl-C is seen
STOP_GRACE_S = 30.0  # after Ctrl-C: time for the learner to finish its step and stop its workers


class LearnerActorDiedError(TandemError):
    """The learner actor's process died (out of memory, node lost, killed)."""


class LearnerActor:
    """Actor body: runs the decoupled learner; ``pid``/``assigned_resources`` say where and with what."""

    def train(
        self, cfg: TandemConfig, resume: bool, progress: bool | None, hooks: RunHooks | None
    ) -> RunResult:
        """``train_decoupled`` in this actor, stopping after the current step once the call is cancelled."""
        ray = import_ray()
        user = hooks or RunHooks()

        def on_step(run: Any, step: int) -> None:
            if user.on_step is not None:
                user.on_step(run, step)
            if ray.get_runtime_context().is_canceled():  # the driver was interrupted
                raise KeyboardInterrupt

        return train_decoupled(
            cfg, resume=resume, progress=progress, hooks=RunHooks(on_step=on_step, extra=user.extra)
        )

    def pid(self) -> int:
        return os.getpid()

    def assigned_resources(self) -> dict[str, float]:
        return dict(import_ray().get_runtime_context().get_assigned_resources())


def train_in_learner_actor(
    cfg: TandemConfig, *, resume: bool = False, progress: bool | None = None, hooks: RunHooks | None = None
) -> RunResult:
    """Run the decoupled training in a learner actor and return its result; ``hooks`` run in the actor."""
    ray = import_ray()
    with RayCluster(cfg) as cluster:
        wait_s = 120.0 if cluster.joined or cluster.reused else 15.0  # a local instance cannot grow
        pg, options = _place(cfg, wait_s)
        actor = None
        try:
            actor = ray.remote(LearnerActor).options(**options).remote()
            ref = actor.train.remote(cfg, resume, progress, hooks)
            try:
                return _result(ray, ref)
            except KeyboardInterrupt:
                log.warning("interrupted: stopping the learner actor (up to %.0f s)", STOP_GRACE_S)
                ray.cancel(ref)
                if ray.wait([ref], timeout=STOP_GRACE_S)[0]:
                    log.warning("the learner actor stopped its run")
                else:
                    log.warning("the learner actor did not stop in time: killing it and the actors it owns")
                raise
        finally:
            if actor is not None:
                ray.kill(actor, no_restart=True)  # its worker and helper actors die with it
            if pg is not None:
                from ray.util.placement_group import remove_placement_group

                remove_placement_group(pg)


def _place(cfg: TandemConfig, wait_s: float) -> tuple[Any, dict[str, Any]]:
    """The learner's placement group (none when it asks for no resources) and its actor options."""
    ray = import_ray()
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    role = cfg.architecture.learner
    options = role_options(role)
    bundle = role_resources(role)
    if not bundle:  # Ray cannot reserve an empty bundle
        return None, options
    # one bundle per data-parallel rank: rank 0 is this actor, ranks 1..M-1 take the others (ray_ranks)
    pg = placement_group(
        [bundle] * role.world_size, strategy="STRICT_PACK" if role.world_size == 1 else "PACK"
    )
    if not ray.wait([pg.ready()], timeout=wait_s)[0]:
        remove_placement_group(pg)
        raise ConfigError(
            f"the Ray cluster cannot reserve {role.world_size} learner bundle(s) of {bundle} within {wait_s:.0f} s "
            f"(cluster: {ray.cluster_resources()})",
            where="architecture.learner.cpus",
            hint="lower architecture.learner resources, or add nodes (architecture.ray.num_cpus locally)",
        )
    options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=0)
    return pg, options


def _result(ray: Any, ref: Any) -> RunResult:
    """Wait for ``ref`` in short polls; a user error in the actor is raised here as itself."""
    from ray.exceptions import RayActorError, RayTaskError

    while not ray.wait([ref], timeout=POLL_S)[0]:
        pass
    try:
        return ray.get(ref)
    except RayTaskError as err:
        if isinstance(err.cause, TandemError):
            raise err.cause from None
        raise
    except RayActorError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise LearnerActorDiedError(
            f"the learner actor died: {first}", where="architecture.ray.learner_actor"
        ) from None
