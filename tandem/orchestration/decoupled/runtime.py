"""Embedded decoupled runtime: one learner (this process) and N rollout worker processes on one machine.

Wiring: a trajectory channel (``architecture.channel``) carries scored batches from the workers to
the learner; a shared-memory weight channel carries versioned weights back; a
:class:`~tandem.orchestration.decoupled.coordination.Coordination` admits batches under the staleness
bound η; a :class:`~tandem.orchestration.decoupled.supervisor.LocalSupervisor` restarts dead workers.
With ``architecture.runtime: ray`` the same parts are Ray-backed (workers are actors, weights go through
the object store; see :mod:`tandem.orchestration.decoupled.backends`); the learner stays in this process
(which is a Ray actor with ``architecture.ray.learner_actor``: :mod:`~tandem.orchestration.decoupled.ray_learner`).
The run folder, metrics, evaluation, checkpoints and alerts (``monitor.alerts``: ``warn``, ``skip``, ``stop``;
``rollback`` is a config error here) are those of the colocated runner. With a durable
channel (Redis Streams) consumed messages are acknowledged only after the checkpoint that contains their
update; a restarted learner re-reads the un-acknowledged ones first.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.context import BaseContext
from typing import Any, NoReturn

import torch

from tandem.channels import TrajectoryChannel, check_channel
from tandem.channels.weights import SharedMemoryWeights
from tandem.config.schema import TandemConfig
from tandem.monitor import MetricsLogger, PhaseTimer
from tandem.monitor.metrics import MetricsListener
from tandem.orchestration.alerting import AlertController, AlertStopError, check_decoupled_rules
from tandem.orchestration.colocated import (
    RunParts,
    evaluate_heldout,
    learner_step,
    load_run_checkpoint,
    save_run_checkpoint,
)
from tandem.orchestration.decoupled.autoscale import Autoscaler
from tandem.orchestration.decoupled.backends import open_backend
from tandem.orchestration.decoupled.coordination import Coordination
from tandem.orchestration.decoupled.learner import DecoupledLearner
from tandem.orchestration.decoupled.ledger import TicketLedger
from tandem.orchestration.decoupled.supervisor import LocalSupervisor
from tandem.orchestration.dp_learner import DataParallelLearner, ProcessLauncher, RankLauncher
from tandem.orchestration.remote import local_models
from tandem.orchestration.runner import (
    KEY_METRICS,
    RunResult,
    _check_finite,
    build_parts,
    check_run_dir,
    finish_run,
    prepare_run_dir,
)
from tandem.orchestration.staleness import StalenessController
from tandem.train.checkpoint import latest_checkpoint

log = logging.getLogger(__name__)


@dataclass
class DecoupledRun:
    """The live parts of a decoupled run, handed to hooks (tests, elasticity policies)."""

    cfg: TandemConfig
    parts: RunParts
    channel: TrajectoryChannel
    weights: SharedMemoryWeights
    coord: Coordination
    supervisor: LocalSupervisor
    learner: DecoupledLearner
    dp: DataParallelLearner | None = None  # ranks 1..M-1 of a data-parallel learner


DECOUPLED_KEY_METRICS = (*KEY_METRICS, "perf/samples_per_s")  # shown on the progress bar


@dataclass
class RunHooks:
    """Optional callbacks; ``on_step(run, step)`` runs after each step is logged and checkpointed."""

    on_step: Callable[[DecoupledRun, int], None] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    listener: MetricsListener | None = None  # also gets every logged row and alert (Ray: to the driver)


def train_decoupled(
    cfg: TandemConfig, *, resume: bool = False, progress: bool | None = None, hooks: RunHooks | None = None
) -> RunResult:
    """Train with the decoupled architecture; same run folder and result as the colocated ``train``."""
    hooks = hooks or RunHooks()
    check_decoupled_rules(cfg)
    ch = cfg.architecture.channel
    check_channel(ch.backend, ch.options, cfg.architecture.runtime)  # before any work: name, options, runtime
    check_run_dir(cfg, resume=resume)
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.architecture.learner.threads)
    parts = build_parts(local_models(cfg))  # URLs: this machine's copies (workers fetch their own)
    run_dir = prepare_run_dir(cfg, resume=resume)  # after the pre-flight build: a failed one writes nothing
    ckpt_root = run_dir / "checkpoints"
    result = RunResult(run_dir=run_dir, steps=0)
    state = _restore(parts, ckpt_root) if resume else None
    version = int(state["step"]) if state else 0
    result.eval_before = state.get("eval_before", {}) if state else {}
    ledger = TicketLedger.from_state(state["ledger"]) if state else TicketLedger()
    generator = torch.Generator().manual_seed(cfg.run.seed)
    if state:
        generator.set_state(torch.tensor(state["generator"], dtype=torch.uint8))

    ctx = mp.get_context("spawn")
    controller = StalenessController(cfg.architecture.staleness, cfg.samples_per_step)
    backend = open_backend(cfg, controller, parts.policy.state_dict(), ctx)  # by runtime
    coord, weights, channel, supervisor = backend.coord, backend.weights, backend.channel, backend.supervisor
    dp: DataParallelLearner | None = None
    try:
        learn = learner_step(cfg, parts, timer=PhaseTimer(), generator=generator)
        if state:
            learn.load_state_dict(state.get("learner", {}))  # adaptive KL coefficient, critic warm-up count
        if cfg.architecture.learner.world_size > 1:  # ranks 1..M-1 of a data-parallel learner
            dp = DataParallelLearner.start(cfg, learn, _rank_launcher(cfg, ctx))
        learner = DecoupledLearner(
            learn,
            channel,
            weights,
            coord,
            controller,
            version=version,
            ledger=ledger,
            poll_workers=supervisor.poll,
            timeout_s=cfg.architecture.learner_timeout_s,
        )
        weights.publish(parts.policy.state_dict(), version)
        _admit_after_restart(learner, coord)
        supervisor.start(cfg.architecture.num_workers)
        run = DecoupledRun(cfg, parts, channel, weights, coord, supervisor, learner, dp)
        _loop(run, result, ckpt_root, progress, hooks)
    finally:  # each step runs even if an earlier one fails (e.g. a second Ctrl-C)
        try:
            supervisor.shutdown()
        finally:
            if dp is not None:
                dp.close()  # never raises
            backend.close()  # channel, weights (and the Ray instance it started)
            torch.set_num_threads(threads)
    result.steps = learner.version
    return finish_run(result, ckpt_root, accounting=ledger.state_dict()["counts"])


def _rank_launcher(cfg: TandemConfig, ctx: BaseContext) -> RankLauncher:
    """Ranks 1..M-1 as Ray actors inside a Ray run's learner actor, else as local processes."""
    if cfg.architecture.runtime == "ray":
        from tandem.orchestration.decoupled.ray_ranks import RayRankLauncher, in_learner_actor

        if in_learner_actor(cfg):
            return RayRankLauncher(cfg)
    return ProcessLauncher(ctx)


def _restore(parts: RunParts, ckpt_root: Any) -> dict[str, Any] | None:
    latest = latest_checkpoint(ckpt_root)
    if latest is None:
        return None
    state = load_run_checkpoint(latest, parts)  # policy, critic, their optimisers, scheduler
    log.info("resumed from %s", latest)
    return {**state["extra_state"]["decoupled"], "eval_before": state["extra_state"].get("eval_before", {})}


def _admit_after_restart(learner: DecoupledLearner, coord: Coordination) -> None:
    """Set the admission counters. Fresh run: 0/0. Restart: un-acknowledged messages of a durable channel
    are buffered first; tickets up to the newest one known exist already, and the buffered ones are the
    only ones still to consume, so capacity is ``η + 1 − buffered`` (see ``staleness``)."""
    recovered = learner.recover() if learner.channel.durable else []
    known = learner.ledger.consumed | set(recovered)
    issued = max(known) + 1 if known else 0
    coord.set_counters(issued=issued, consumed=issued - len(recovered))
    if recovered:
        log.info("re-read %d un-acknowledged batches after restart: tickets %s", len(recovered), recovered)


def _loop(
    run: DecoupledRun, result: RunResult, ckpt_root: Any, progress: bool | None, hooks: RunHooks
) -> None:
    cfg, learner, parts = run.cfg, run.learner, run.parts
    mon = cfg.monitor
    with MetricsLogger(
        result.run_dir,
        total_steps=cfg.trainer.total_steps,
        key_metrics=DECOUPLED_KEY_METRICS,
        tensorboard=mon.tensorboard,
        progress=mon.progress if progress is None else progress,
        start_step=learner.version,
        listener=hooks.listener,
    ) as logger:
        alerting = AlertController(cfg, result.run_dir, learner, logger.alert)  # rules: warn/skip/stop
        autoscaler = Autoscaler(cfg.architecture.autoscale) if cfg.architecture.autoscale.enabled else None
        try:
            if learner.version == 0:
                result.eval_before = evaluate_heldout(parts)
                logger.log(0, result.eval_before)
            while learner.version < cfg.trainer.total_steps:
                metrics = learner.step()
                step = learner.version
                last = step == cfg.trainer.total_steps
                if (mon.eval_every and step % mon.eval_every == 0) or last:
                    metrics.update(evaluate_heldout(parts))
                if mon.sample_every and (step % mon.sample_every == 0 or step == 1) and mon.num_samples:
                    logger.log_samples(step, learner.last_samples(mon.num_samples, cfg.rollout.n))
                metrics["decoupled/workers_alive"] = float(run.supervisor.num_alive)
                metrics["decoupled/worker_restarts"] = float(run.supervisor.total_restarts)
                if autoscaler is not None:
                    metrics["decoupled/autoscale"] = float(_autoscale(run, autoscaler, metrics))
                _check_finite(metrics, step)
                outcome = alerting.after_step(step, metrics)
                logger.log(step, metrics)
                result.last_metrics = metrics
                if outcome == "stop":
                    _stop_by_alert(run, result, ckpt_root, step)
                if (cfg.checkpoint.every and step % cfg.checkpoint.every == 0) or (
                    last and cfg.checkpoint.save_final
                ):
                    _checkpoint(run, result, ckpt_root)
                    learner.acknowledge()  # only now is the update that used these samples durable
                if hooks.on_step is not None:
                    hooks.on_step(run, step)
        finally:
            alerting.close()


def _autoscale(run: DecoupledRun, autoscaler: Autoscaler, metrics: dict[str, float]) -> int:
    """Apply the elastic-scaling decision of this step; returns it (+1 added, −1 retired, 0 none)."""
    depth = max(0, int(metrics.get("channel/depth", 0)))
    decision = autoscaler.decide(
        learner_idle=metrics.get("idle/learner_ratio", 0.0),
        rollout_idle=metrics.get("idle/rollout_ratio", 0.0),
        waiting=depth + int(metrics.get("channel/buffered", 0)),
        workers=run.supervisor.num_active,
    )
    if decision > 0:
        slot = run.supervisor.add_worker()
        log.info("autoscale: learner starved, added rollout worker %d", slot)
    elif decision < 0:
        slot = run.supervisor.remove_worker()
        log.info("autoscale: channel full, retiring rollout worker %d", slot)
    return decision


def _stop_by_alert(run: DecoupledRun, result: RunResult, ckpt_root: Any, step: int) -> NoReturn:
    """Alert action ``stop``: checkpoint (then acknowledge), write ``summary.json``, raise AlertStopError.
    The caller's ``finally`` blocks stop the workers."""
    _checkpoint(run, result, ckpt_root)
    run.learner.acknowledge()
    result.steps = step
    accounting = run.learner.ledger.state_dict()["counts"]
    finish_run(result, ckpt_root, accounting=accounting, stopped_by_alert=step)
    raise AlertStopError(f"stopped by an alert at step {step}", where=str(result.run_dir / "alerts.jsonl"))


def _checkpoint(run: DecoupledRun, result: RunResult, ckpt_root: Any) -> None:
    learner, parts = run.learner, run.parts
    extra = {
        "decoupled": {
            "step": learner.version,
            "ledger": learner.ledger.state_dict(),
            "generator": learner.learn.generator.get_state().tolist(),
            "learner": learner.learn.state_dict(),
        },
        "eval_before": result.eval_before,
    }
    save_run_checkpoint(ckpt_root, learner.version, parts, run.cfg, extra)
