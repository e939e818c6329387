"""The decoupled architecture's entry point: one learner (this process) and N rollout workers.

Wiring: a trajectory channel (``architecture.channel``) carries scored batches from the workers to the
learner; a weight channel carries versioned weights back; an admission control admits batches under the
staleness bound η; a supervisor restarts dead workers. ``architecture.runtime`` picks the implementations
(:mod:`tandem.orchestration.decoupled.backends`: processes and shared memory on one machine, or Ray actors
and the object store); the learner stays in this process (a Ray actor with ``architecture.ray.learner_actor``:
:mod:`~tandem.orchestration.decoupled.ray_learner`).

The learner is the shared :class:`~tandem.orchestration.trainer.Trainer` with the decoupled strategies
(:mod:`tandem.orchestration.decoupled.learner`) in the shared loop (:mod:`tandem.orchestration.loop`): the
run folder, metrics, evaluation, checkpoints and alerts are the colocated run's. With a durable channel
(Redis Streams) consumed messages are acknowledged only after the checkpoint that contains their update; a
restarted learner re-reads the un-acknowledged ones first.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from multiprocessing.context import BaseContext
from pathlib import Path
from typing import Any

import torch

from tandem.channels import TrajectoryChannel, check_channel
from tandem.channels.base import WeightChannel
from tandem.config.schema import TandemConfig
from tandem.models.lora import engine_state_dict, publishable_state_dict
from tandem.monitor import PhaseTimer
from tandem.monitor.metrics import MetricsListener
from tandem.orchestration.build import build_rollout_engine
from tandem.orchestration.decoupled.autoscale import Autoscaler
from tandem.orchestration.decoupled.backends import open_backend
from tandem.orchestration.decoupled.controls import LearnerControls, LearnerCurriculum, LearnerTemperature
from tandem.orchestration.decoupled.learner import ChannelSource, ChannelWeights
from tandem.orchestration.decoupled.ledger import TicketLedger
from tandem.orchestration.decoupled.seams import Admission, WorkerSupervisor
from tandem.orchestration.dp_learner import DataParallelLearner, ProcessLauncher, RankLauncher
from tandem.orchestration.loop import KEY_METRICS, LoopSetup, run_loop
from tandem.orchestration.parts import (
    RunParts,
    build_parts,
    evaluate_heldout,
    evaluated_weights,
    learner_step,
    load_run_checkpoint,
)
from tandem.orchestration.remote import local_models
from tandem.orchestration.rollout_step import temperature_controller
from tandem.orchestration.runfolder import RunResult, check_run_dir, finish_run, prepare_run_dir
from tandem.orchestration.staleness import StalenessController
from tandem.orchestration.trainer import Trainer
from tandem.train.checkpoint import checkpoint_step, latest_checkpoint

log = logging.getLogger(__name__)


@dataclass
class DecoupledRun:
    """The live parts of a decoupled run, handed to hooks (tests, elasticity policies)."""

    cfg: TandemConfig
    parts: RunParts
    channel: TrajectoryChannel
    weights: WeightChannel
    coord: Admission
    supervisor: WorkerSupervisor
    learner: Trainer
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
    ch = cfg.architecture.channel
    check_channel(ch.backend, ch.options, cfg.architecture.runtime)  # before any work: name, options, runtime
    check_run_dir(cfg, resume=resume)
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.architecture.learner.threads)
    parts = build_parts(local_models(cfg))  # URLs: this machine's copies (workers fetch their own)
    prepared = prepare_run_dir(cfg, resume=resume)  # after the pre-flight build: a failed one writes nothing
    run_dir = prepared.path
    result = RunResult(run_dir=run_dir, steps=0)
    latest = latest_checkpoint(run_dir / "checkpoints") if resume else None
    first = checkpoint_step(latest.name) if latest is not None else 0
    holder: list[Trainer] = []
    try:
        trainer = _run(cfg, parts, latest, result, threads, progress, hooks, holder)
    except BaseException:
        if not holder or holder[0].step <= first:  # nothing trained: the folder goes back as it was
            prepared.undo()
        raise
    result.steps = trainer.step
    return finish_run(result, run_dir / "checkpoints", **trainer.summary())


def _run(
    cfg: TandemConfig,
    parts: RunParts,
    latest: Path | None,
    result: RunResult,
    threads: int,
    progress: bool | None,
    hooks: RunHooks,
    holder: list[Trainer],
) -> Trainer:
    """The run after its folder is prepared: restore ``latest`` (a resume), open the channels, start the
    workers and the loop; everything opened is closed however it ends. The learner goes into ``holder``
    as soon as it exists (the caller's undo asks it whether a step was trained)."""
    ctx = mp.get_context("spawn")
    controller = StalenessController(cfg.architecture.staleness, cfg.samples_per_step)
    try:
        extra = load_run_checkpoint(latest, parts)["extra_state"] if latest is not None else None
        controls = learner_controls(cfg, len(parts.data.train))  # published with the weights (.controls)
        template = {**publishable_state_dict(parts.policy), **controls.tensors()}
        # a run with no checkpoint to resume from starts on a clean channel (a durable one keeps entries)
        backend = open_backend(cfg, controller, template, ctx, fresh=latest is None)  # by runtime
    except BaseException:  # what the finally below closes once the backend is open
        torch._C.set_num_threads(threads)
        parts.engine.close()
        raise
    supervisor = backend.supervisor
    dp: DataParallelLearner | None = None
    try:
        source = ChannelSource(
            backend.channel,
            backend.coord,
            controller,
            ledger=TicketLedger(),
            poll_workers=supervisor.poll,
            timeout_s=cfg.architecture.learner_timeout_s,
            controls=controls,
        )
        generator = torch.Generator().manual_seed(cfg.run.seed)

        def evaluate() -> dict[str, float]:
            # The learner's engine only evaluates: one that shares the policy module (hf) copies nothing,
            # one with its own copy (vllm) loads the current weights first. An FSDP2 learner's rank 0
            # evaluates a transient copy gathered from the shards (a shared-module engine: over it).
            # With trainer.ema_decay the weight average is evaluated (the rollout workers keep the live ones).
            with evaluated_weights(parts), trainer.learn.plain_policy() as policy:
                engine = parts.engine
                if policy is not parts.policy and getattr(engine, "model", None) is parts.policy:
                    engine = build_rollout_engine(cfg, model=policy, tokenizer=parts.tokenizer)
                engine.update_weights(engine_state_dict(engine, policy), trainer.version)
                return evaluate_heldout(replace(parts, engine=engine), trainer.step)

        learn = learner_step(cfg, parts, timer=PhaseTimer(), generator=generator)
        trainer = Trainer(
            learn,
            source,
            ChannelWeights(backend.weights, learn, controls),
            evaluate=evaluate,
            group_size=cfg.rollout.group_size,
        )
        holder.append(trainer)
        if extra is not None:  # policy, critic, optimisers, ledger, β, critic warm-up count; publishes
            trainer.restore(extra)
            result.eval_before = extra.get("eval_before", {})
            log.info("resumed from %s", latest)
        else:
            trainer.publish()
        if cfg.architecture.learner.world_size > 1:  # ranks 1..M-1 of a data-parallel learner
            dp = DataParallelLearner.start(cfg, trainer.learn, _rank_launcher(cfg, ctx))
        _admit_after_restart(source, backend.coord)
        supervisor.start(cfg.architecture.num_workers)
        run = DecoupledRun(
            cfg, parts, backend.channel, backend.weights, backend.coord, supervisor, trainer, dp
        )
        resumed = (latest, extra) if latest is not None and extra is not None else None
        run_loop(_loop_setup(run, result, progress, hooks, resumed))
    finally:  # each step runs even if an earlier one fails (e.g. a second Ctrl-C)
        try:
            supervisor.shutdown()
        finally:
            if dp is not None:
                dp.close()  # never raises
            backend.close()  # channel, weights (and the Ray instance it started)
            torch._C.set_num_threads(threads)  # torch.set_num_threads is a no-op once vLLM ran on CPU
            parts.engine.close()  # the learner's evaluation engine
    return trainer


def _loop_setup(
    run: DecoupledRun,
    result: RunResult,
    progress: bool | None,
    hooks: RunHooks,
    resumed: tuple[Path, dict[str, Any]] | None,
) -> LoopSetup:
    """The shared loop with the decoupled additions: worker and elastic-scaling metrics, the hooks."""
    arch = run.cfg.architecture
    autoscaler = (
        Autoscaler(arch.autoscale, staleness=arch.staleness, in_flight=arch.weight_sync == "in_flight")
        if arch.autoscale.enabled
        else None
    )

    def extra_metrics(metrics: dict[str, float]) -> dict[str, float]:
        out = {
            "decoupled/workers_alive": float(run.supervisor.num_alive),
            "decoupled/worker_restarts": float(run.supervisor.total_restarts),
        }
        if autoscaler is not None:
            out["decoupled/autoscale"] = float(_autoscale(run, autoscaler, metrics))
        return out

    on_step = None if hooks.on_step is None else (lambda step: hooks.on_step(run, step))  # type: ignore[misc]
    return LoopSetup(
        run.cfg,
        run.parts,
        run.learner,
        result,
        DECOUPLED_KEY_METRICS,
        progress=progress,
        listener=hooks.listener,
        extra_metrics=extra_metrics,
        on_step=on_step,
        resumed=resumed,
    )


def learner_controls(cfg: TandemConfig, num_prompts: int) -> LearnerControls:
    """What the learner steers for its workers: the adaptive sampling temperature
    (``rollout.adaptive_temperature``) and, with a prompt curriculum, the per-prompt statistics of its
    ``num_prompts`` training prompts; either may be absent."""
    ctl = temperature_controller(cfg)
    return LearnerControls(
        temperature=None if ctl is None else LearnerTemperature(ctl),
        curriculum=LearnerCurriculum(num_prompts) if cfg.data.curriculum.kind != "uniform" else None,
    )


def _rank_launcher(cfg: TandemConfig, ctx: BaseContext) -> RankLauncher:
    """Ranks 1..M-1 as Ray actors inside a Ray run's learner actor, else as local processes."""
    if cfg.architecture.runtime == "ray":
        from tandem.orchestration.decoupled.ray_ranks import RayRankLauncher, in_learner_actor

        if in_learner_actor(cfg):
            return RayRankLauncher(cfg)
    return ProcessLauncher(ctx)


def _admit_after_restart(source: ChannelSource, coord: Admission) -> None:
    """Set the admission counters. Fresh run: 0/0. Restart: un-acknowledged messages of a durable channel
    are buffered first; tickets up to the newest one known exist already, and the buffered ones are the
    only ones still to consume, so capacity is ``η + 1 − buffered`` (see ``staleness``)."""
    recovered = source.recover()
    known = source.ledger.consumed | set(recovered)
    issued = max(known) + 1 if known else 0
    coord.set_counters(issued=issued, consumed=issued - len(recovered))
    if recovered:
        log.info("re-read %d un-acknowledged batches after restart: tickets %s", len(recovered), recovered)


def _autoscale(run: DecoupledRun, autoscaler: Autoscaler, metrics: dict[str, float]) -> int:
    """Apply the elastic-scaling decision of this step; returns it (+1 added, −1 retired, 0 none)."""
    depth = max(0, int(metrics.get("channel/depth", 0)))
    decision = autoscaler.decide(
        learner_idle=metrics.get("idle/learner_ratio", 0.0),
        rollout_idle=metrics.get("idle/rollout_ratio", 0.0),
        waiting=depth + int(metrics.get("channel/buffered", 0)),
        workers=run.supervisor.num_active,
        metrics=metrics,
    )
    why = (
        f"planner target {autoscaler.last_target} workers"
        if autoscaler.cfg.target == "planner"
        else ("learner starved" if decision > 0 else "channel full")
    )
    if decision > 0:
        slot = run.supervisor.add_worker()
        log.info("autoscale: %s, added rollout worker %d", why, slot)
    elif decision < 0:
        slot = run.supervisor.remove_worker()
        log.info("autoscale: %s, retiring rollout worker %d", why, slot)
    return decision
