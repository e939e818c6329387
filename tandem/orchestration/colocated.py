"""The colocated architecture: one process generates with the very weights it trains (policy lag 0).

One training step, in named and timed phases::

    generate -> reward -> (dynamic-sampling filter) -> logprob -> advantage -> update -> sync

The step asks the algorithm library for estimators and losses by the names in the config; it never
branches on an algorithm name.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tandem.config.schema import TandemConfig
from tandem.evaluate import evaluate_prompts
from tandem.monitor import PhaseTimer
from tandem.orchestration.build import DataParts
from tandem.orchestration.learner import LearnerStep
from tandem.orchestration.remote import mirror_checkpoint
from tandem.orchestration.rollout_step import RolloutStep, SequentialPrompts, sample_rows
from tandem.rewards import RewardSet
from tandem.rollout.base import RolloutEngine, SamplingParams
from tandem.train.checkpoint import load_checkpoint, save_checkpoint
from tandem.types import RolloutBatch


@dataclass
class RunParts:
    """Everything a training loop needs, built from the config (see ``build.py``)."""

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


def load_run_checkpoint(path: Path, parts: RunParts) -> dict[str, Any]:
    """Restore policy, critic, their optimisers, the scheduler and RNG from checkpoint ``path``."""
    return load_checkpoint(
        path,
        model=parts.policy,
        optimizer=parts.optimizer,
        scheduler=parts.scheduler,
        critic=parts.critic,
        critic_optimizer=parts.critic_optimizer,
    )


def save_run_checkpoint(
    ckpt_root: Path, step: int, parts: RunParts, cfg: TandemConfig, extra_state: dict[str, Any]
) -> Path:
    """The counterpart of :func:`load_run_checkpoint`: policy, tokenizer, critic, their optimisers, the
    scheduler, ``extra_state`` (the architecture's own state) and the config, atomically; then copied to
    ``checkpoint.remote_dir`` when set."""
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
    )
    mirror_checkpoint(cfg, folder)  # checkpoint.remote_dir: a copy in object storage
    return folder


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
    )


class ColocatedTrainer:
    """Runs training steps on injected parts; holds only the loop's own state (step, sampler, groups)."""

    def __init__(self, parts: RunParts) -> None:
        self.parts = parts
        cfg = parts.cfg
        self.cfg = cfg
        self.prompts = SequentialPrompts(parts.data.train, cfg.data.prompts_per_step, cfg.run.seed)
        self.timer = PhaseTimer()
        self.rollout = RolloutStep(
            cfg,
            parts.engine,
            parts.rewards,
            self.prompts,
            timer=self.timer,
            pad_token_id=parts.tokenizer.pad_token_id,
        )
        self.step = 0
        self.generator = torch.Generator().manual_seed(cfg.run.seed)
        self.learner = learner_step(cfg, parts, timer=self.timer, generator=self.generator)
        self._last: tuple[RolloutBatch, torch.Tensor] | None = None
        # Alert hook: sees the step's metrics so far before each optimizer.step(); False drops the update.
        self.pre_update: Callable[[dict[str, float]], bool] | None = None

    # -- state for checkpoints -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            **self.prompts.state_dict(),
            "generator": self.generator.get_state().tolist(),
            "learner": self.learner.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self.prompts.load_state_dict(state)
        self.generator.set_state(torch.tensor(state["generator"], dtype=torch.uint8))
        self.learner.load_state_dict(state.get("learner", {}))
        self.parts.engine.update_weights(None, self.step)

    # -- phases ----------------------------------------------------------------------------------------
    def collect(self) -> tuple[RolloutBatch, torch.Tensor, dict[str, float]]:
        """Generate and score this step's batch (:class:`~tandem.orchestration.rollout_step.RolloutStep`)."""
        scored = self.rollout(self.step)
        return scored.batch, scored.scores, scored.metrics

    def train_step(self) -> dict[str, float]:
        """One full step; returns its metrics."""
        self.timer.reset()
        t0 = time.perf_counter()
        batch, scores, metrics = self.collect()
        self._last = (batch, scores)
        metrics.update(rollout_metrics(batch, self.timer.metrics().get("timing/generate", 0.0)))
        if batch.batch_size > 0:
            hook = self.pre_update
            self.learner.pre_step = None if hook is None else (lambda m: hook({**metrics, **m}))
            metrics.update(self._learn(batch, scores))
        self.step += 1
        with self.timer.phase("sync"):
            self.parts.engine.update_weights(None, self.step)  # colocated: same weights, new version
        metrics.update(self.timer.metrics())
        metrics["timing/step"] = time.perf_counter() - t0
        return metrics

    def _learn(self, batch: RolloutBatch, scores: torch.Tensor) -> dict[str, float]:
        """The learner phases (logprob -> advantage -> update), shared with the decoupled learner."""
        return self.learner(batch, scores)

    def last_samples(self, n: int) -> list[dict[str, Any]]:
        """A few prompts with their completions and rewards from the last step, to read for reward hacking."""
        return [] if self._last is None else sample_rows(*self._last, n, self.cfg.rollout.n)

    def evaluate(self) -> dict[str, float]:
        """Greedy accuracy on the held-out prompts."""
        with self.timer.phase("eval"):
            return evaluate_heldout(self.parts)


def evaluate_heldout(parts: RunParts) -> dict[str, float]:
    """Greedy accuracy of ``parts.engine`` on the held-out prompts (``{}`` without any)."""
    ev = parts.data.eval
    if ev is None or len(ev) == 0:
        return {}
    r = parts.cfg.rollout
    params = SamplingParams(max_new_tokens=r.max_new_tokens, temperature=0.0, n=1, stop=list(r.stop))
    return evaluate_prompts(parts.engine, ev.rows, parts.eval_rewards, params)


def rollout_metrics(batch: RolloutBatch, gen_seconds: float) -> dict[str, float]:
    """Response-length and generation-throughput metrics of one batch."""
    if batch.batch_size == 0:
        return {}
    lengths = batch.response_lengths.float()
    return {
        "response/length_mean": float(lengths.mean()),
        "response/length_max": float(lengths.max()),
        "response/clip_ratio": sum(r == "length" for r in batch.finish_reasons) / batch.batch_size,
        "perf/gen_tokens_per_s": float(lengths.sum()) / max(1e-9, gen_seconds),
    }
