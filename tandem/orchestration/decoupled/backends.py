"""The per-runtime parts of a decoupled run, chosen by ``architecture.runtime``.

=========================  =================================  =====================================
part                       ``embedded`` (one machine)         ``ray`` (a Ray cluster)
=========================  =================================  =====================================
admission (coordination)   shared memory + lock               one actor on the driver's node
weight channel             shared-memory block                numpy arrays in the object store
trajectory channel         ``architecture.channel.backend``   ``ray`` (actor queue) or ``redis``
rollout workers            processes (LocalSupervisor)        actors (RaySupervisor, placement group)
=========================  =================================  =====================================

In both runtimes the learner runs in the process that calls the factory: the driver, or with
``architecture.ray.learner_actor`` the learner actor (:mod:`~tandem.orchestration.decoupled.ray_learner`).
:class:`Backend.close` releases what the factory created, including the Ray instance when it started one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.context import BaseContext

import torch

from tandem.channels import ChannelSetting, TrajectoryChannel, open_channel
from tandem.channels.base import WeightChannel
from tandem.channels.weights import SharedMemoryWeights
from tandem.config.schema import TandemConfig
from tandem.orchestration.decoupled.coordination import Coordination
from tandem.orchestration.decoupled.seams import Admission, WorkerSupervisor
from tandem.orchestration.decoupled.supervisor import LocalSupervisor
from tandem.orchestration.staleness import StalenessController


@dataclass
class Backend:
    """Admission, weight channel, trajectory channel and supervisor of one run, plus their cleanup."""

    coord: Admission
    weights: WeightChannel
    channel: TrajectoryChannel
    supervisor: WorkerSupervisor
    cleanups: list[Callable[[], None]] = field(default_factory=list)  # run in reverse order

    def close(self) -> None:
        """Release everything (after ``supervisor.shutdown()``); each step runs even if one fails."""
        release(self.cleanups)


def release(cleanups: list[Callable[[], None]]) -> None:
    """Run ``cleanups`` in reverse order, each even if a later one failed (the first error is raised)."""
    with contextlib.ExitStack() as stack:
        for fn in cleanups:
            stack.callback(fn)


def open_trajectory_channel(
    cfg: TandemConfig, ctx: BaseContext | None, *, fresh: bool = False
) -> TrajectoryChannel:
    """The configured trajectory channel (``architecture.channel``), built by its backend from its options."""
    ch = cfg.architecture.channel
    setting = ChannelSetting(
        run_name=cfg.run.name, runtime=cfg.architecture.runtime, mp_context=ctx, fresh=fresh
    )
    return open_channel(ch.backend, ch.options, setting)


def open_backend(
    cfg: TandemConfig,
    controller: StalenessController,
    template: dict[str, torch.Tensor],
    ctx: BaseContext,
    *,
    fresh: bool = False,
) -> Backend:
    """Create the parts for ``cfg.architecture.runtime``; ``template`` is the policy's state dict."""
    if cfg.architecture.runtime == "ray":
        return _open_ray(cfg, controller, ctx, fresh)
    coord = Coordination(ctx, controller)
    weights = SharedMemoryWeights(template, ctx)
    try:  # a channel that cannot open (Redis down) must not leave the weights' shared memory behind
        channel = open_trajectory_channel(cfg, ctx, fresh=fresh)
    except BaseException:
        weights.unlink()
        raise
    supervisor = LocalSupervisor(ctx, cfg, channel, weights, coord)
    return Backend(coord, weights, channel, supervisor, [weights.unlink, channel.close])


def _open_ray(cfg: TandemConfig, controller: StalenessController, ctx: BaseContext, fresh: bool) -> Backend:
    from tandem.channels.ray_weights import RayObjectStoreWeights
    from tandem.orchestration.decoupled.ray_cluster import RayCluster
    from tandem.orchestration.decoupled.ray_coordination import RayCoordination
    from tandem.orchestration.decoupled.ray_supervisor import RaySupervisor

    cluster = RayCluster(cfg)
    cleanups: list[Callable[[], None]] = [cluster.close]  # last
    try:
        coord = RayCoordination(controller)
        cleanups.append(coord.close)
        weights = RayObjectStoreWeights()
        cleanups.append(weights.unlink)
        channel = open_trajectory_channel(cfg, ctx, fresh=fresh)
        cleanups.append(channel.close)
    except BaseException:
        release(cleanups)
        raise
    # a local instance has all its resources from the start: do not wait long for what cannot come
    wait_s = 120.0 if cluster.joined or cluster.reused else 15.0
    supervisor = RaySupervisor(cfg, channel, weights, coord, placement_timeout_s=wait_s)
    return Backend(coord, weights, channel, supervisor, cleanups)
