"""The training loop of both architectures: one driver owns the step sequence and everything after a step.

Per step::

    trainer.train_step()          obtain a batch -> learn -> publish weights (:mod:`~.trainer`)
    held-out evaluation           every ``monitor.eval_every`` steps and after the last one
    samples                       every ``monitor.sample_every`` steps (and step 1)
    architecture metrics          ``LoopSetup.extra_metrics`` (decoupled: workers, elastic scaling)
    non-finite check              a warning naming the metrics
    alerts                        warn, skip (vetoed inside the update), stop, rollback
    metrics row                   ``metrics.jsonl``, TensorBoard, the progress bar
    best model                    ``checkpoint.best_metric``: ``best/`` replaced when an evaluation beats it
    checkpoint                    every ``checkpoint.every`` steps and at the end (then the source is told:
                                  a durable channel acknowledges the batches it holds)
    ``LoopSetup.on_step``         hooks (tests, the Ray learner actor's cancellation)

A checkpoint (and a best model) is skipped at a step that raised an alert when the run has a ``rollback``
rule: it could become the rollback target, which must be healthy. Colocated and decoupled runs differ only
in their trainer's batch source and weight publisher, so every alert action works in both, with any
learner strategy (one process, DDP, FSDP2) and a weight average or not.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NoReturn

from tandem.config.schema import TandemConfig
from tandem.errors import ModelError
from tandem.monitor import MetricsLogger
from tandem.monitor.metrics import MetricsListener
from tandem.monitor.trackers import Tracker, TrackerRun, open_trackers
from tandem.orchestration.alerting import ALERT_STATE_KEY, AlertController, AlertStopError
from tandem.orchestration.best import BestModel
from tandem.orchestration.parts import RunParts, evaluated_weights, run_state, save_run_checkpoint
from tandem.orchestration.runfolder import RunResult, finish_run
from tandem.orchestration.trainer import Trainer
from tandem.train.checkpoint import latest_checkpoint

log = logging.getLogger(__name__)

KEY_METRICS = ("reward/mean", "eval/accuracy", "actor/kl", "response/length_mean")  # on the progress bar


@dataclass
class LoopSetup:
    """What :func:`run_loop` drives: the trainer on its parts, where results go, and the architecture's
    additions (extra metrics per step, a hook after each step, a listener for every logged row)."""

    cfg: TandemConfig
    parts: RunParts
    trainer: Trainer
    result: RunResult
    key_metrics: tuple[str, ...] = KEY_METRICS
    progress: bool | None = None  # None: monitor.progress
    listener: MetricsListener | None = None
    extra_metrics: Callable[[dict[str, float]], dict[str, float]] | None = None
    on_step: Callable[[int], None] | None = None
    resumed: tuple[Path, dict[str, Any]] | None = None  # a resume: its checkpoint folder and extra_state


def run_loop(setup: LoopSetup) -> None:
    """Train until ``trainer.total_steps``; raises :class:`AlertStopError` after a ``stop`` alert (with a
    checkpoint and ``summary.json`` written). The caller writes ``summary.json`` of a finished run."""
    cfg, trainer, result = setup.cfg, setup.trainer, setup.result
    mon, ck = cfg.monitor, cfg.checkpoint
    tracked = TrackerRun(
        result.run_dir,
        cfg.run.name,
        cfg.model_dump(mode="json"),
        project=mon.project,
        group=mon.group,
        tags=tuple(mon.tags),
        start_step=trainer.step,
    )
    with MetricsLogger(
        result.run_dir,
        total_steps=cfg.trainer.total_steps,
        key_metrics=setup.key_metrics,
        tensorboard=mon.tensorboard,
        progress=mon.progress if setup.progress is None else setup.progress,
        start_step=trainer.step,
        listener=setup.listener,
        trackers=_start_trackers(setup, tracked),
    ) as logger:
        alerting = AlertController(cfg, result.run_dir, trainer, logger.alert)
        best = BestModel(result.run_dir, ck.best_metric, ck.best_mode) if ck.best_metric else None
        try:
            if setup.resumed is not None:  # the rules' history and the rollback count go on
                restore_alerts(alerting, *setup.resumed)
            if trainer.step == 0:
                result.eval_before = trainer.evaluate()
                logger.log(0, result.eval_before)
                keep_best(setup, best, 0, result.eval_before)
            if (
                alerting.wants_initial_checkpoint
                and latest_checkpoint(result.run_dir / "checkpoints") is None
            ):
                checkpoint(setup, alerting)  # something for a rollback to restore
            while trainer.step < cfg.trainer.total_steps:
                metrics = trainer.train_step()
                step = trainer.step
                last = step == cfg.trainer.total_steps
                _observe(setup, logger, metrics, step, last)
                outcome = alerting.after_step(step, metrics)
                logger.log(step, metrics)
                result.last_metrics = metrics
                if outcome == "stop":
                    _stop_by_alert(setup, alerting, step)
                if outcome == "rollback":
                    alerting.rollback(setup.parts)
                    continue
                healthy = not (alerting.wants_initial_checkpoint and alerting.fired_this_step)
                if healthy:
                    keep_best(setup, best, step, metrics)
                due = (ck.every and step % ck.every == 0) or (last and ck.save_final)
                if due and (healthy or last):
                    checkpoint(setup, alerting)
                if setup.on_step is not None:
                    setup.on_step(step)
        finally:
            alerting.close()


def _start_trackers(setup: LoopSetup, run: TrackerRun) -> list[Tracker]:
    """``monitor.report_to``'s runs. One that cannot start (W&B without a login) ends the run before its
    first step, which the architectures undo as a failed pre-flight (:meth:`~tandem.orchestration.
    runfolder.PreparedRunDir.undo`)."""
    return open_trackers(setup.cfg.monitor.report_to, run)


def _observe(setup: LoopSetup, logger: MetricsLogger, metrics: dict[str, Any], step: int, last: bool) -> None:
    """The step's evaluation, samples, architecture metrics and non-finite check (before the alerts)."""
    mon, trainer = setup.cfg.monitor, setup.trainer
    if (mon.eval_every and step % mon.eval_every == 0) or last:
        metrics.update(trainer.evaluate())
    if mon.sample_every and (step % mon.sample_every == 0 or step == 1) and mon.num_samples:
        logger.log_samples(step, trainer.last_samples(mon.num_samples))
    if setup.extra_metrics is not None:
        metrics.update(setup.extra_metrics(metrics))
    check_finite(metrics, step)


def keep_best(setup: LoopSetup, best: BestModel | None, step: int, metrics: dict[str, Any]) -> None:
    """``checkpoint.best_metric``: replace ``best/`` when this step's evaluation beats the best so far."""
    if best is None:
        return
    value = best.candidate(metrics)
    if value is not None:
        # the weights evaluated (trainer.ema_decay: the average); FSDP2 rank 0: gathered, transient
        with evaluated_weights(setup.parts), setup.trainer.learn.plain_policy() as policy:
            best.save(step, value, policy, setup.parts.tokenizer, run_state(setup.parts, step).to_json())
    setup.result.best = best.summary()


def restore_alerts(alerting: AlertController, folder: Path, extra_state: dict[str, Any]) -> None:
    """On resume, give ``alerting`` the state saved in checkpoint ``folder`` (its ``extra_state``, as the
    trainer was restored from). A checkpoint without one (written before alert state was saved) starts
    the alerts fresh."""
    saved = extra_state.get(ALERT_STATE_KEY)
    if saved is None:
        if alerting.engine.rules:
            log.info("checkpoint %s has no alert state (an older version's): alerts start fresh", folder.name)
        return
    try:
        alerting.load_state_dict(saved)
    except ValueError as err:
        raise ModelError(f"extra_state.{ALERT_STATE_KEY}: {err}", where=str(folder / "state.json")) from None


def checkpoint(setup: LoopSetup, alerting: AlertController) -> None:
    """Save the parts, the trainer's and the alerts' state at its step; then the batch source may
    acknowledge."""
    trainer = setup.trainer
    extra = {
        trainer.source.state_key: trainer.state_dict(),
        ALERT_STATE_KEY: alerting.state_dict(),
        "eval_before": setup.result.eval_before,
        "trainer_state": run_state(setup.parts, trainer.step).to_json(),  # what `tandem eval` passes on
    }
    root, shards = setup.result.run_dir / "checkpoints", trainer.learn.shard_writer()
    # FSDP2 decoupled rank 0: model/ is a transient copy gathered from the shards, of the weights the run
    # evaluates (trainer.ema_decay: the average); the DCP shards written beside it hold the live weights
    # (and a moved KL reference sharded over FSDP2 ranks: a transient copy too, for reference.safetensors)
    with trainer.learn.plain_policy(averaged=True) as policy, trainer.learn.plain_reference() as reference:
        gathered = policy is not setup.parts.policy
        parts = replace(setup.parts, policy=policy, average=None) if gathered else setup.parts
        parts = replace(parts, ref_model=reference)
        save_run_checkpoint(root, trainer.step, parts, setup.cfg, extra, sharded=shards)
    trainer.source.checkpointed()  # only now is every update so far durable


def _stop_by_alert(setup: LoopSetup, alerting: AlertController, step: int) -> NoReturn:
    """Alert action ``stop``: save a checkpoint, write ``summary.json`` and end with AlertStopError (the
    callers' ``finally`` blocks release workers)."""
    checkpoint(setup, alerting)
    alerting.close()
    result = setup.result
    result.steps = step
    finish_run(result, result.run_dir / "checkpoints", **setup.trainer.summary(), stopped_by_alert=step)
    raise AlertStopError(f"stopped by an alert at step {step}", where=str(result.run_dir / "alerts.jsonl"))


def check_finite(metrics: dict[str, Any], step: int) -> None:
    """Warn when the loss or the reward of a step is not finite (naming every non-finite metric)."""
    bad = [k for k, v in metrics.items() if isinstance(v, float) and not math.isfinite(v)]
    if any(k in ("actor/pg_loss", "reward/mean") for k in bad):
        log.warning("step %d: non-finite metrics %s", step, ", ".join(bad))
