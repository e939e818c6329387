"""Score a rollout batch: reward functions (TRL signature), optional DAPO overlong shaping."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tandem.rewards import RewardSet, overlong_shaping
from tandem.types import RolloutBatch


@dataclass(frozen=True)
class OverlongShaping:
    max_len: int
    buffer: int
    factor: float


def score_rollout(
    rollout: RolloutBatch, rewards: RewardSet, overlong: OverlongShaping | None = None
) -> tuple[torch.Tensor, dict[str, float]]:
    """Sequence scores ``[B]`` and reward metrics (``reward/<fn>/mean``, ``reward/overlong_mean``, ...)."""
    result = rewards(rollout.prompts, rollout.completions, rollout.columns())
    scores = result.scores.float()
    metrics = dict(result.metrics)
    if overlong is not None:
        penalty = overlong_shaping(
            rollout.response_lengths, overlong.max_len, overlong.buffer, overlong.factor
        )
        metrics["reward/overlong_mean"] = float(penalty.mean())
        scores = scores + penalty
    return scores, metrics
