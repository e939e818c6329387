"""Run a training job end to end: run folder, parts, resume, the step loop, evaluation, checkpoints.

The run folder holds ``config.yaml`` (resolved), ``metrics.jsonl``, ``samples.jsonl``, ``tensorboard/``,
``checkpoints/step-N/`` and — written last, atomically — ``summary.json``. A folder without
``summary.json`` is an unfinished run (``--resume`` continues it).
"""

from __future__ import annotations

import logging
import math
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from tandem.config import config_to_yaml
from tandem.config.schema import TandemConfig
from tandem.data.outputs import check_output_dir
from tandem.errors import ConfigError
from tandem.monitor import MetricsLogger
from tandem.monitor.metrics import METRICS_FILE
from tandem.orchestration.alerting import AlertController, AlertStopError
from tandem.orchestration.build import (
    build_critic,
    build_data,
    build_eval_rewards,
    build_policy,
    build_reference,
    build_rewards,
    build_rollout_engine,
    enforce_prompt_lengths,
)
from tandem.orchestration.colocated import (
    ColocatedTrainer,
    RunParts,
    load_run_checkpoint,
    save_run_checkpoint,
)
from tandem.orchestration.remote import check_remote, fetch_newer_checkpoint, local_models
from tandem.train.checkpoint import latest_checkpoint
from tandem.train.optim import build_optimizer, build_scheduler
from tandem.utils.io import atomic_write_json, atomic_write_text
from tandem.utils.seed import seed_everything

log = logging.getLogger(__name__)

KEY_METRICS = ("reward/mean", "eval/accuracy", "actor/kl", "response/length_mean")


@dataclass
class RunResult:
    run_dir: Path
    steps: int
    eval_before: dict[str, float] = field(default_factory=dict)
    eval_after: dict[str, float] = field(default_factory=dict)
    last_metrics: dict[str, float] = field(default_factory=dict)


def run_dir_of(cfg: TandemConfig) -> Path:
    return Path(cfg.run.output_dir) if cfg.run.output_dir else Path("runs") / cfg.run.name


def run_inputs(cfg: TandemConfig) -> tuple[str | None, ...]:
    """The folders and files a run reads (models, data): replacing the run folder must not delete them."""
    reward_model = cfg.reward.model.path if cfg.reward.model else None
    critic = cfg.critic.path if cfg.critic else None
    return (cfg.model.path, cfg.model.ref_path, critic, reward_model, cfg.data.train_file, cfg.data.eval_file)


def check_run_dir(cfg: TandemConfig, *, resume: bool) -> Path:
    """The run folder, after refusing what the run may not write into; writes nothing.

    A non-empty folder needs ``--resume`` or ``run.overwrite``; ``run.overwrite`` replaces only a Tandem
    run folder (``config.yaml`` + ``metrics.jsonl``, see :mod:`tandem.data.outputs`), never an unrelated
    folder nor one holding a model or data file the run reads (:func:`run_inputs`)."""
    run_dir = run_dir_of(cfg)
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"run folder {run_dir} is a file", where="run.output_dir")
    holds = run_dir.is_dir() and any(run_dir.iterdir())
    if holds and not (resume or cfg.run.overwrite):
        raise ConfigError(
            f"run folder {run_dir} already holds a run",
            where="run.output_dir",
            hint="pass --resume to continue it, run.overwrite=true, or another run.output_dir",
        )
    if holds and not resume:
        check_output_dir(
            run_dir,
            "run",
            sources=run_inputs(cfg),
            where="run.output_dir",
            hint="run.overwrite replaces only run folders; choose another run.output_dir",
        )
    return run_dir


def prepare_run_dir(cfg: TandemConfig, *, resume: bool) -> Path:
    """Create (or reopen on resume) the run folder and write the resolved config into it.

    Call it after the run's pre-flight checks (:func:`check_run_dir`, building the model and rewards):
    a run that fails them must leave nothing behind, or the corrected rerun would find a "run" there.
    ``run.overwrite`` moves the old run aside in one rename before deleting it, so a crash never
    leaves a half-deleted run that still looks like one."""
    run_dir = check_run_dir(cfg, resume=resume)
    check_remote(cfg)  # checkpoint.remote_dir must be writable before any training
    if run_dir.is_dir() and any(run_dir.iterdir()) and not resume:
        # A fresh run must not inherit the old run's checkpoints (a later --resume would pick them up).
        aside = run_dir.with_name(f".{run_dir.name}.replaced-{os.getpid()}")
        os.replace(run_dir, aside)
        shutil.rmtree(aside)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "summary.json").unlink(missing_ok=True)
    atomic_write_text(run_dir / "config.yaml", config_to_yaml(cfg))
    (run_dir / METRICS_FILE).touch()  # with config.yaml: what marks a Tandem run folder
    if resume:  # checkpoint.remote_dir: continue from a newer copy there (e.g. on a fresh machine)
        fetch_newer_checkpoint(cfg, run_dir / "checkpoints")
    return run_dir


def build_parts(cfg: TandemConfig) -> RunParts:
    """Build every component of a colocated run from the config."""
    seed_everything(cfg.run.seed)
    policy, tokenizer = build_policy(cfg.model, seed=cfg.run.seed)
    data = enforce_prompt_lengths(build_data(cfg.data, seed=cfg.run.seed), tokenizer, cfg.data)
    rewards = build_rewards(cfg.reward, data.task)
    optimizer = build_optimizer(policy, cfg.trainer)
    critic, critic_optimizer = build_critic(cfg, seed=cfg.run.seed, policy=policy, optimizer=optimizer)
    samples = cfg.samples_per_step
    opt_steps = (
        cfg.trainer.total_steps
        * cfg.trainer.ppo_epochs
        * (samples // (cfg.trainer.mini_batch_size or samples))
    )
    return RunParts(
        cfg=cfg,
        policy=policy,
        tokenizer=tokenizer,
        ref_model=build_reference(cfg.model, cfg.algorithm.beta),
        engine=build_rollout_engine(cfg, model=policy, tokenizer=tokenizer),
        data=data,
        rewards=rewards,
        eval_rewards=build_eval_rewards(cfg, data.task, rewards),
        optimizer=optimizer,
        scheduler=build_scheduler(optimizer, cfg.trainer, opt_steps),
        critic=critic,
        critic_optimizer=critic_optimizer,
    )


def train(cfg: TandemConfig, *, resume: bool = False, progress: bool | None = None) -> RunResult:
    """Train with the configured architecture (colocated here; decoupled in ``decoupled.runtime``);
    returns the run folder and before/after evaluation. Model folders given as URLs are used from this
    machine's copies (:func:`~tandem.orchestration.remote.local_models`), fetched by each process that
    loads them; the run's config keeps the URLs."""
    if cfg.architecture.mode == "decoupled" and cfg.architecture.ray.learner_actor:  # runtime ray
        from tandem.orchestration.decoupled.ray_learner import train_in_learner_actor

        return train_in_learner_actor(cfg, resume=resume, progress=progress)
    if cfg.architecture.mode == "decoupled":
        from tandem.orchestration.decoupled.runtime import train_decoupled

        return train_decoupled(cfg, resume=resume, progress=progress)
    check_run_dir(cfg, resume=resume)
    parts = build_parts(local_models(cfg))  # URLs: this machine's copies; fails on a bad model or reward
    run_dir = prepare_run_dir(cfg, resume=resume)  # only now: a failed pre-flight leaves no folder behind
    trainer = ColocatedTrainer(parts)
    ckpt_root = run_dir / "checkpoints"
    result = RunResult(run_dir=run_dir, steps=0)
    latest = latest_checkpoint(ckpt_root) if resume else None
    if latest is not None:
        state = load_run_checkpoint(latest, parts)
        trainer.load_state_dict(state["extra_state"]["trainer"])
        result.eval_before = state["extra_state"].get("eval_before", {})
        log.info("resumed from %s at step %d", latest, trainer.step)
    mon = cfg.monitor
    show = mon.progress if progress is None else progress
    with MetricsLogger(
        run_dir,
        total_steps=cfg.trainer.total_steps,
        key_metrics=KEY_METRICS,
        tensorboard=mon.tensorboard,
        progress=show,
        start_step=trainer.step,
    ) as logger:
        alerting = AlertController(cfg, run_dir, trainer, logger.alert)
        if trainer.step == 0:
            result.eval_before = trainer.evaluate()
            logger.log(0, result.eval_before)

        def checkpoint() -> None:
            extra = {"trainer": trainer.state_dict(), "eval_before": result.eval_before}
            save_run_checkpoint(ckpt_root, trainer.step, parts, cfg, extra)

        if alerting.wants_initial_checkpoint and latest_checkpoint(ckpt_root) is None:
            checkpoint()  # something for a rollback to restore
        while trainer.step < cfg.trainer.total_steps:
            metrics = trainer.train_step()
            step = trainer.step
            last = step == cfg.trainer.total_steps
            if (mon.eval_every and step % mon.eval_every == 0) or last:
                metrics.update(trainer.evaluate())
            if mon.sample_every and (step % mon.sample_every == 0 or step == 1) and mon.num_samples:
                logger.log_samples(step, trainer.last_samples(mon.num_samples))
            _check_finite(metrics, step)
            outcome = alerting.after_step(step, metrics)
            logger.log(step, metrics)
            result.last_metrics = metrics
            if outcome == "stop":
                _stop_by_alert(result, step, checkpoint, alerting, ckpt_root)
            if outcome == "rollback":
                alerting.rollback(parts)
                continue
            good = not alerting.fired_this_step or last  # a rollback target must be a healthy step
            if good and (
                (cfg.checkpoint.every and step % cfg.checkpoint.every == 0)
                or (last and cfg.checkpoint.save_final)
            ):
                checkpoint()
        alerting.close()
    result.steps = trainer.step
    return finish_run(result, ckpt_root)


def _stop_by_alert(
    result: RunResult, step: int, checkpoint: Callable[[], None], alerting: AlertController, ckpt_root: Path
) -> NoReturn:
    """Alert action ``stop``: save a checkpoint, write ``summary.json`` and end with AlertStopError."""
    checkpoint()
    alerting.close()
    result.steps = step
    finish_run(result, ckpt_root, stopped_by_alert=step)
    raise AlertStopError(f"stopped by an alert at step {step}", where=str(result.run_dir / "alerts.jsonl"))


def finish_run(result: RunResult, ckpt_root: Path, **extra: Any) -> RunResult:
    """Fill ``eval_after`` and write ``summary.json`` last (atomically): the run is complete."""
    result.eval_after = {k: v for k, v in result.last_metrics.items() if k.startswith("eval/")}
    summary = {
        "steps": result.steps,
        "eval_before": result.eval_before,
        "eval_after": result.eval_after,
        "final_metrics": result.last_metrics,
        "checkpoint": str(latest_checkpoint(ckpt_root) or ""),
        **extra,
    }
    atomic_write_json(result.run_dir / "summary.json", summary)
    return result


def _check_finite(metrics: dict[str, Any], step: int) -> None:
    bad = [k for k, v in metrics.items() if isinstance(v, float) and not math.isfinite(v)]
    if any(k in ("actor/pg_loss", "reward/mean") for k in bad):
        log.warning("step %d: non-finite metrics %s", step, ", ".join(bad))
