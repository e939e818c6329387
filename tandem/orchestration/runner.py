"""Run a training job end to end: :func:`train` picks the architecture (``architecture.mode``).

Both architectures write the same run folder (:mod:`tandem.orchestration.runfolder`) and run the same loop
(:mod:`tandem.orchestration.loop`) over the same step (:mod:`tandem.orchestration.trainer`); they differ in
how a step obtains its batch and publishes weights (:mod:`tandem.orchestration.colocated`,
:mod:`tandem.orchestration.decoupled.runtime`).
"""

from __future__ import annotations

from tandem.config.schema import TandemConfig
from tandem.monitor.trackers import check_trackers
from tandem.orchestration.colocated import train_colocated
from tandem.orchestration.runfolder import RunResult


def train(cfg: TandemConfig, *, resume: bool = False, progress: bool | None = None) -> RunResult:
    """Train with the configured architecture; returns the run folder and before/after evaluation. Model
    folders given as URLs are used from this machine's copies (fetched by each process that loads them);
    the run's config keeps the URLs."""
    check_trackers(cfg.monitor.report_to)  # a tracker that cannot start stops the run before any work
    if cfg.architecture.mode == "decoupled" and cfg.architecture.ray.learner_actor:  # runtime ray
        from tandem.channels import check_channel
        from tandem.orchestration.decoupled.ray_learner import train_in_learner_actor

        ch = cfg.architecture.channel  # before a Ray instance starts (seconds): the actor checks it again
        check_channel(ch.backend, ch.options, cfg.architecture.runtime)

        return train_in_learner_actor(cfg, resume=resume, progress=progress)
    if cfg.architecture.mode == "decoupled":
        from tandem.orchestration.decoupled.runtime import train_decoupled

        return train_decoupled(cfg, resume=resume, progress=progress)
    return train_colocated(cfg, resume=resume, progress=progress)
