"""The parts of a run (models, engine, data, rewards, optimisers), built once from the config, and what is
done with them as a whole: checkpoint, restore, evaluate, make the learner.

Both architectures build the same :class:`RunParts` in the learner's process (a decoupled run uses its
engine for the held-out evaluation); the loop and the step receive them (dependency injection), so tests can
swap any of them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tandem.config.schema import TandemConfig
from tandem.errors import ConfigError, ModelError
from tandem.evaluate import evaluate_prompts
from tandem.monitor import PhaseTimer
from tandem.orchestration.build import (
    DataParts,
    build_critic,
    build_data,
    build_eval_rewards,
    build_policy,
    build_reference,
    build_rewards,
    build_rollout_engine,
    build_teacher,
    enforce_prompt_lengths,
)
from tandem.orchestration.learner import LearnerStep
from tandem.orchestration.reference_answers import reference_settings
from tandem.orchestration.remote import mirror_checkpoint
from tandem.orchestration.scoring import trainer_state
from tandem.rewards import RewardSet, TrainerState
from tandem.rollout.base import RolloutEngine, SamplingParams
from tandem.rollout.environments import env_factory, episode_runner
from tandem.rollout.episodes import mean_stats
from tandem.train.averaging import WeightAverage, load_live_weights
from tandem.train.checkpoint import (
    LIVE_WEIGHTS,
    REFERENCE_WEIGHTS,
    SHARDED_STATE,
    load_checkpoint,
    load_live_state,
    load_model_weights,
    load_reference_state,
    save_checkpoint,
)
from tandem.train.optim import build_optimizer, build_scheduler
from tandem.train.reference_sync import parameter_mismatch, reference_weights
from tandem.utils.seed import seed_everything


@dataclass
class RunParts:
    """Everything a training loop needs, built from the config (:func:`build_parts`)."""

    cfg: TandemConfig
    policy: torch.nn.Module
    tokenizer: Any
    ref_model: torch.nn.Module | None
    engine: RolloutEngine
    data: DataParts
    rewards: RewardSet
    eval_rewards: RewardSet
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    critic: torch.nn.Module | None = None  # value model, for estimators that need values
    critic_optimizer: torch.optim.Optimizer | None = None
    teacher: torch.nn.Module | None = None  # on-policy distillation's frozen teacher
    average: WeightAverage | None = None  # trainer.ema_decay: what is evaluated and saved as model/


def optimizer_steps(cfg: TandemConfig) -> int:
    """Optimiser steps of the whole run: the learning-rate schedule's horizon (every learner rank uses it)."""
    samples = cfg.samples_per_step
    return (
        cfg.trainer.total_steps
        * cfg.trainer.ppo_epochs
        * (samples // (cfg.trainer.mini_batch_size or samples))
    )


def build_parts(cfg: TandemConfig) -> RunParts:
    """Build every component of a run from the config (the engine samples with the policy module)."""
    seed_everything(cfg.run.seed)
    policy, tokenizer = build_policy(cfg.model, seed=cfg.run.seed)
    teacher = build_teacher(cfg, tokenizer)  # before the data: a tokenizer mismatch fails first
    data = enforce_prompt_lengths(build_data(cfg.data, seed=cfg.run.seed), tokenizer, cfg.data)
    rewards = build_rewards(cfg.reward, data.task)
    for ds in (data.train, data.eval):  # pre-flight: a function needing a column no row has
        if ds is not None:
            rewards.check_columns(ds.extra_columns, source=ds.source)
    env_factory(cfg.env)  # pre-flight: a bad env section fails before the run folder is written
    engine = build_rollout_engine(cfg, model=policy, tokenizer=tokenizer)
    reference_settings(cfg, engine, data.train, tokenizer.pad_token_id)  # pre-flight: engine and column
    optimizer = build_optimizer(policy, cfg.trainer)
    critic, critic_optimizer = build_critic(cfg, seed=cfg.run.seed, policy=policy, optimizer=optimizer)
    ref_model = build_reference(cfg.model, cfg.algorithm.beta, policy=policy)
    if cfg.algorithm.kl.ref_sync_steps and ref_model is not None:  # pre-flight: a reference that can follow
        why = parameter_mismatch(ref_model, policy)
        if why:
            raise ConfigError(
                f"algorithm.kl.ref_sync_steps needs a reference of the policy's architecture: {why}",
                where="model.ref_path",
            )
    return RunParts(
        cfg=cfg,
        policy=policy,
        tokenizer=tokenizer,
        ref_model=ref_model,
        engine=engine,
        data=data,
        rewards=rewards,
        eval_rewards=build_eval_rewards(cfg, data.task, rewards),
        optimizer=optimizer,
        scheduler=build_scheduler(optimizer, cfg.trainer, optimizer_steps(cfg)),
        critic=critic,
        critic_optimizer=critic_optimizer,
        teacher=teacher,
        average=WeightAverage.of(policy, d) if (d := cfg.trainer.ema_decay) > 0 else None,
    )


@contextmanager
def evaluated_weights(parts: RunParts) -> Iterator[bool]:
    """Inside, ``parts.policy`` holds the weights a run evaluates and saves: the average with
    ``trainer.ema_decay`` (yields True; the live weights are back on exit), else the live ones (False)."""
    if parts.average is None:
        yield False
        return
    with parts.average.applied():
        yield True


def learner_step(
    cfg: TandemConfig, parts: RunParts, *, timer: PhaseTimer, generator: torch.Generator
) -> LearnerStep:
    """The shared learner phases over this run's policy, reference, critic and optimisers."""
    return LearnerStep.from_config(
        cfg,
        policy=parts.policy,
        ref_model=parts.ref_model,
        optimizer=parts.optimizer,
        scheduler=parts.scheduler,
        timer=timer,
        generator=generator,
        critic=parts.critic,
        critic_optimizer=parts.critic_optimizer,
        teacher=parts.teacher,
        average=parts.average,
    )


def restart_average(path: Path, parts: RunParts) -> None:
    """``parts.average`` restarts from checkpoint ``path``'s ``model/`` (the average it evaluated) while the
    policy keeps the live weights it holds now: an FSDP2 checkpoint's, restored from its DCP shards (at a
    resume, or by an alert's rollback where rank 0 averages its plain policy alone)."""
    assert parts.average is not None
    live = parts.average.live_weights()
    load_model_weights(Path(path) / "model", parts.policy)
    parts.average.restart()
    load_live_weights(parts.policy, live)


def restore_reference(path: Path, parts: RunParts) -> None:
    """The moved KL reference a checkpoint keeps (``algorithm.kl.ref_sync_steps``), into ``parts.ref_model``;
    nothing where the checkpoint has none or the run has no reference."""
    reference = load_reference_state(path)
    if reference is not None and parts.ref_model is not None:
        try:
            load_live_weights(parts.ref_model, reference, what="reference weight", of="the reference")
        except ValueError as err:
            raise ModelError(str(err), where=str(Path(path) / REFERENCE_WEIGHTS)) from err


def load_run_checkpoint(path: Path, parts: RunParts) -> dict[str, Any]:
    """Restore policy, critic, their optimisers, the scheduler and RNG from checkpoint ``path``. A
    checkpoint with live weights beside its ``model/`` (``trainer.ema_decay``; FSDP2: or in its DCP shards)
    restores them into the policy, and its ``model/`` as the weight average (a fresh one, when the run has
    none now)."""
    state = load_checkpoint(
        path,
        model=parts.policy,
        optimizer=parts.optimizer,
        scheduler=parts.scheduler,
        critic=parts.critic,
        critic_optimizer=parts.critic_optimizer,
    )
    live = load_live_state(path)
    restore_reference(path, parts)
    if parts.average is not None:  # model/ holds the average (or, from a run without one, the weights)
        if (Path(path) / SHARDED_STATE).is_dir():  # FSDP2: the policy holds the shards' live weights
            restart_average(path, parts)
        else:
            parts.average.restart()
    if live is not None:
        try:
            load_live_weights(parts.policy, live)
        except ValueError as err:
            raise ModelError(str(err), where=str(Path(path) / LIVE_WEIGHTS)) from err
    return state


def save_run_checkpoint(
    ckpt_root: Path,
    step: int,
    parts: RunParts,
    cfg: TandemConfig,
    extra_state: dict[str, Any],
    sharded: Callable[[Path], None] | None = None,
) -> Path:
    """The counterpart of :func:`load_run_checkpoint`: policy, tokenizer, critic, their optimisers, the
    scheduler, ``extra_state`` (the loop's own state) and the config, atomically; then copied to
    ``checkpoint.remote_dir`` when set. ``sharded``: the learner ranks write the optimiser state as
    shards (FSDP2, :meth:`~tandem.orchestration.learner.LearnerStep.shard_writer`)."""
    average = parts.average
    with evaluated_weights(parts):  # model/: the weights the run evaluates
        folder = save_checkpoint(
            ckpt_root,
            step,
            model=parts.policy,
            tokenizer=parts.tokenizer,
            optimizer=parts.optimizer,
            scheduler=parts.scheduler,
            extra_state=extra_state,
            config=cfg.model_dump(mode="json"),
            keep_last=cfg.checkpoint.keep_last,
            critic=parts.critic,
            critic_optimizer=parts.critic_optimizer,
            sharded=sharded,
            # sharded: the DCP shards hold the live weights
            live_weights=None if average is None or average.sharded else average.live_weights(),
            reference_weights=(
                reference_weights(parts.ref_model)
                if cfg.algorithm.kl.ref_sync_steps and parts.ref_model is not None
                else None
            ),
        )
    mirror_checkpoint(cfg, folder)  # checkpoint.remote_dir: a copy in object storage
    return folder


def run_state(parts: RunParts, step: int) -> TrainerState:
    """The reward functions' ``trainer_state`` after ``step`` steps of this run: what its held-out
    evaluation passes, and what the models it keeps record (``tandem eval`` passes it on)."""
    return trainer_state(parts.cfg, step, len(parts.data.train))


def evaluate_heldout(parts: RunParts, step: int | None = None) -> dict[str, float]:
    """Greedy accuracy of ``parts.engine`` on the held-out prompts (``{}`` without any); ``step``: the
    steps trained so far, which the reward functions see as ``trainer_state`` (None: they get None)."""
    ev = parts.data.eval
    if ev is None or len(ev) == 0:
        return {}
    r = parts.cfg.rollout
    params = SamplingParams(max_new_tokens=r.max_new_tokens, temperature=0.0, n=1, stop=list(r.stop))
    state = None if step is None else run_state(parts, step)
    if parts.cfg.env is None:
        return evaluate_prompts(parts.engine, ev.rows, parts.eval_rewards, params, state=state)
    runner = episode_runner(parts.cfg.env, parts.engine)  # held-out episodes, scored on the final answer
    runner.log = []
    metrics = evaluate_prompts(runner, ev.rows, parts.eval_rewards, params, state=state)
    return {**metrics, **{f"eval/{k}": v for k, v in mean_stats(runner.log).items()}}
