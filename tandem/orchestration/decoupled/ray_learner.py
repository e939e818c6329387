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
from collections.abc import Callable
from typing import Any

from rich.console import Console

from tandem.channels.ray import driver_node_strategy, free_queue, import_ray
from tandem.config.schema import TandemConfig
from tandem.errors import ConfigError, TandemError, first_line
from tandem.monitor.progress import MetricsProgress, ProgressDisplay
from tandem.orchestration.decoupled.ray_cluster import RayCluster
from tandem.orchestration.decoupled.ray_supervisor import role_options, role_resources
from tandem.orchestration.decoupled.runtime import DECOUPLED_KEY_METRICS, RunHooks, train_decoupled
from tandem.orchestration.runfolder import RunResult

log = logging.getLogger(__name__)

POLL_S = 0.5  # the driver returns to Python this often, so a Ctrl-C is seen
STOP_GRACE_S = 30.0  # after Ctrl-C: time for the learner to finish its step and stop its workers


class LearnerActorDiedError(TandemError):
    """The learner actor's process died (out of memory, node lost, killed)."""


class ProgressForwarder:
    """A :class:`~tandem.monitor.metrics.MetricsListener` in the learner actor: sends each logged row (plain
    numbers and strings) and each alert to the driver's progress queue (fire and forget; one caller, so
    order is kept)."""

    def __init__(self, queue: Any) -> None:
        self.queue = queue

    def log(self, step: int, values: Any) -> None:
        self.queue.actor.put_nowait.remote(("log", step, dict(values)))

    def alert(self, message: str) -> None:
        self.queue.actor.put_nowait.remote(("alert", message))


class LearnerActor:
    """Actor body: runs the decoupled learner; ``pid``/``assigned_resources`` say where and with what."""

    def train(
        self, cfg: TandemConfig, resume: bool, progress_queue: Any, hooks: RunHooks | None
    ) -> RunResult:
        """``train_decoupled`` in this actor, stopping after the current step once the call is cancelled;
        rows and alerts go to ``progress_queue`` (the driver's bar) when one is given."""
        ray = import_ray()
        user = hooks or RunHooks()

        def on_step(run: Any, step: int) -> None:
            if user.on_step is not None:
                user.on_step(run, step)
            if ray.get_runtime_context().is_canceled():  # the driver was interrupted
                raise KeyboardInterrupt

        listener = None if progress_queue is None else ProgressForwarder(progress_queue)
        return train_decoupled(
            cfg, resume=resume, progress=False, hooks=RunHooks(on_step, extra=user.extra, listener=listener)
        )

    def pid(self) -> int:
        return os.getpid()

    def assigned_resources(self) -> dict[str, float]:
        return dict(import_ray().get_runtime_context().get_assigned_resources())


class DriverProgress:
    """The driver's progress bar for a learner actor: drains the queue the actor's rows arrive on."""

    def __init__(self, cfg: TandemConfig) -> None:
        from ray.util.queue import Queue

        self.total_steps = cfg.trainer.total_steps
        self.queue = Queue(actor_options={"num_cpus": 0, "scheduling_strategy": driver_node_strategy()})
        self.view: MetricsProgress | None = None  # made at the first row, which tells a resumed run's start

    def poll(self) -> None:
        """Show what arrived since the last poll."""
        n = self.queue.qsize()
        for item in self.queue.get_nowait_batch(n) if n else []:
            if self.view is None:
                first = item[1] if item[0] == "log" else 0  # a fresh run logs step 0 or 1 first
                display = ProgressDisplay(
                    total_steps=self.total_steps, start_step=max(0, first - 1), console=Console()
                )
                self.view = MetricsProgress(display, DECOUPLED_KEY_METRICS)
            if item[0] == "log":
                self.view.log(item[1], item[2])
            else:
                self.view.alert(item[1])

    def close(self) -> None:
        """Show the last rows, stop the bar and free the queue actor (never raises)."""
        try:
            self.poll()
        except Exception:  # the queue actor is gone: nothing more to show
            log.debug("progress queue unavailable at close", exc_info=True)
        finally:
            if self.view is not None:
                self.view.close()
            free_queue(self.queue)


def train_in_learner_actor(
    cfg: TandemConfig, *, resume: bool = False, progress: bool | None = None, hooks: RunHooks | None = None
) -> RunResult:
    """Run the decoupled training in a learner actor and return its result; ``hooks`` run in the actor.
    The progress bar (``monitor.progress`` unless ``progress`` says otherwise) is shown here, in the driver."""
    ray = import_ray()
    show = cfg.monitor.progress if progress is None else progress
    with RayCluster(cfg) as cluster:
        wait_s = 120.0 if cluster.joined or cluster.reused else 15.0  # a local instance cannot grow
        pg, options = _place(cfg, wait_s)
        actor = None
        bar = None
        try:
            bar = DriverProgress(cfg) if show else None
            actor = ray.remote(LearnerActor).options(**options).remote()
            ref = actor.train.remote(cfg, resume, None if bar is None else bar.queue, hooks)
            try:
                return _result(ray, ref, None if bar is None else bar.poll)
            except KeyboardInterrupt:
                log.warning("interrupted: stopping the learner actor (up to %.0f s)", STOP_GRACE_S)
                ray.cancel(ref)
                if ray.wait([ref], timeout=STOP_GRACE_S)[0]:
                    log.warning("the learner actor stopped its run")
                else:
                    log.warning("the learner actor did not stop in time: killing it and the actors it owns")
                raise
        finally:
            if bar is not None:
                bar.close()
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


def _result(ray: Any, ref: Any, on_poll: Callable[[], None] | None = None) -> RunResult:
    """Wait for ``ref`` in short polls (calling ``on_poll`` after each); a user error in the actor is
    raised here as itself."""
    from ray.exceptions import RayActorError, RayTaskError

    while not ray.wait([ref], timeout=POLL_S)[0]:
        if on_poll is not None:
            on_poll()
    try:
        return ray.get(ref)
    except RayTaskError as err:
        if isinstance(err.cause, TandemError):
            raise err.cause from None
        raise
    except RayActorError as err:
        raise LearnerActorDiedError(
            f"the learner actor died: {first_line(err)}", where="architecture.ray.learner_actor"
        ) from None
