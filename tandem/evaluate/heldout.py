"""Held-out evaluation: generate for every held-out prompt and score with the verifier."""

from __future__ import annotations

from typing import Any

import torch

from tandem.rewards import RewardSet
from tandem.rollout.base import RolloutEngine, SamplingParams


def evaluate_prompts(
    engine: RolloutEngine,
    rows: list[dict[str, Any]],
    rewards: RewardSet,
    params: SamplingParams,
    *,
    batch_size: int = 64,
    prefix: str = "eval",
) -> dict[str, float]:
    """Greedy (or sampled, per ``params``) answers to ``rows``; accuracy = share of samples whose score
    reaches the maximum 1.0, plus mean reward and response length."""
    scores, lengths = [], []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        extras = [{k: v for k, v in r.items() if k != "prompt"} for r in chunk]
        batch = engine.generate([r["prompt"] for r in chunk], params, extras=extras)
        scores.append(rewards(batch.prompts, batch.completions, batch.columns()).scores.float())
        lengths.append(batch.response_lengths.float())
    if not scores:
        return {}
    s = torch.cat(scores)
    n = torch.cat(lengths)
    return {
        f"{prefix}/accuracy": float((s >= 1.0 - 1e-6).float().mean()),
        f"{prefix}/reward_mean": float(s.mean()),
        f"{prefix}/length_mean": float(n.mean()),
    }
