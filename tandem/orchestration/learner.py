"""The learner side of a training step, shared by both architectures: logprob -> advantage -> update.

The colocated trainer calls it right after generating; the decoupled learner calls it on batches that
arrive through the trajectory channel. Same code, same phases, same metrics — only the source of the batch
differs. Losses and estimators come from the algorithm library by name (through the settings).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from tandem.config.schema import TandemConfig
from tandem.monitor import PhaseTimer
from tandem.train.experience import ExperienceSettings, make_experience
from tandem.train.update import UpdateSettings, policy_update
from tandem.types import RolloutBatch


@dataclass
class LearnerStep:
    """Turns a scored rollout batch into one policy update (timed phases ``logprob`` and ``update``)."""

    policy: torch.nn.Module
    ref_model: torch.nn.Module | None
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler | None
    update_settings: UpdateSettings
    exp_settings: ExperienceSettings
    timer: PhaseTimer
    generator: torch.Generator
    pre_step: Callable[[dict[str, float]], bool] | None = None  # alert veto before optimizer.step()

    @classmethod
    def from_config(
        cls,
        cfg: TandemConfig,
        *,
        policy: torch.nn.Module,
        ref_model: torch.nn.Module | None,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler | None,
        timer: PhaseTimer,
        generator: torch.Generator,
    ) -> LearnerStep:
        update = UpdateSettings.from_config(
            cfg.algorithm,
            cfg.trainer,
            temperature=cfg.rollout.temperature,
            autocast_bf16=cfg.model.autocast_bf16,
            max_new_tokens=cfg.rollout.max_new_tokens,
        )
        exp = ExperienceSettings.from_config(
            cfg.algorithm,
            temperature=cfg.rollout.temperature,
            autocast_bf16=cfg.model.autocast_bf16,
            micro_batch_size=cfg.trainer.micro_batch_size,
        )
        return cls(policy, ref_model, optimizer, scheduler, update, exp, timer, generator)

    def __call__(self, batch: RolloutBatch, scores: torch.Tensor) -> dict[str, float]:
        """One update on ``batch`` with sequence rewards ``scores`` ``[B]``; returns ``actor/*`` metrics."""
        s = self.update_settings
        with self.timer.phase("logprob"):
            exp, metrics = make_experience(
                batch,
                scores,
                self.exp_settings,
                policy=None if s.on_policy_single_pass else self.policy,
                ref_model=self.ref_model,
            )
        with self.timer.phase("update"):
            metrics.update(
                policy_update(
                    self.policy,
                    self.optimizer,
                    self.scheduler,
                    exp,
                    s,
                    generator=self.generator,
                    pre_step=self.pre_step,
                )
            )
        tokens = int(batch.prompt_mask.sum() + batch.response_mask.sum())
        metrics["perf/train_tokens_per_s"] = tokens / max(1e-9, self.timer.metrics()["timing/update"])
        metrics["actor/kl"] = metrics.get("actor/kl_ref", metrics.get("actor/approx_kl", 0.0))
        metrics["actor/clipfrac"] = metrics.get("actor/clipfrac", 0.0)
        return metrics
