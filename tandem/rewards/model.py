"""A learned reward model as a reward function in TRL's signature, with normalisation.

This layer cannot load models (no transformers in L1), so the scorer is injected: any
``scorer(prompts, completions) -> list[float]`` — :func:`tandem.train.rm.score_texts` bound to a loaded
model in practice (see ``tandem.orchestration.build.build_rewards``): a causal-LM head or an encoder
classifier (BERT, RoBERTa), either re-tokenising the policy's text with its own tokenizer, which is why
the scorer takes text and never the policy's token ids. What lives here is what RL needs
around it: batching, and normalisation so the reward model's arbitrary scale does not fight the weights
of function rewards in the sum.

Normalisation modes:
- ``none``: raw scores;
- ``fixed``: ``(r - mean) / std`` with constants (from ``tandem_reward.json`` written by ``tandem rm``);
- ``running``: ``(r - mean) / std`` with the mean/std of every score seen so far, this batch included
  (Welford's update: exact, numerically stable — naive equivalent: keep all scores and recompute).
Optional ``clip`` bounds the normalised value to ``[-clip, clip]``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from tandem.errors import ConfigError, RewardError

Scorer = Callable[[Sequence[Any], Sequence[Any]], Sequence[float]]
Normalize = Literal["none", "fixed", "running"]


@dataclass
class RunningMoments:
    """Streaming mean and variance (Welford): ``update`` with a batch, read ``mean`` / ``std``."""

    count: int = 0
    mean: float = 0.0
    m2: float = 0.0

    def update(self, values: Sequence[float]) -> None:
        for x in values:
            self.count += 1
            delta = x - self.mean
            self.mean += delta / self.count
            self.m2 += delta * (x - self.mean)

    @property
    def std(self) -> float:
        """Population std of everything seen (1.0 until two values are in, so nothing blows up)."""
        return math.sqrt(self.m2 / self.count) if self.count > 1 and self.m2 > 0 else 1.0


class RewardModelReward:
    """Callable reward ``f(prompts, completions, **columns) -> list[float]`` backed by a scorer."""

    def __init__(
        self,
        scorer: Scorer,
        *,
        normalize: Normalize = "running",
        mean: float = 0.0,
        std: float = 1.0,
        clip: float | None = None,
        batch_size: int = 64,
        name: str = "reward_model",
    ) -> None:
        if normalize not in ("none", "fixed", "running"):
            raise ConfigError(f"unknown normalisation '{normalize}'", where="reward.model.normalize")
        if normalize == "fixed" and not std > 0:
            raise ConfigError(f"fixed normalisation needs std > 0, got {std}", where="reward.model.std")
        self.scorer, self.normalize, self.clip, self.batch_size = scorer, normalize, clip, batch_size
        self.fixed_mean, self.fixed_std = mean, std
        self.moments = RunningMoments()
        self.__name__ = name  # RewardFunction names metrics after this

    def raw_scores(self, prompts: Sequence[Any], completions: Sequence[Any]) -> list[float]:
        """Unnormalised scores, scored ``batch_size`` at a time; checked finite and one per completion."""
        scores: list[float] = []
        for i in range(0, len(completions), self.batch_size):
            chunk = list(self.scorer(prompts[i : i + self.batch_size], completions[i : i + self.batch_size]))
            if len(chunk) != len(completions[i : i + self.batch_size]):
                raise RewardError(
                    f"reward model returned {len(chunk)} scores for {len(completions[i : i + self.batch_size])} completions"
                )
            scores.extend(float(s) for s in chunk)
        if not all(math.isfinite(s) for s in scores):
            raise RewardError("reward model returned a non-finite score")
        return scores

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **columns: Any) -> list[float]:
        scores = self.raw_scores(prompts, completions)
        if self.normalize == "fixed":
            mean, std = self.fixed_mean, self.fixed_std
        elif self.normalize == "running":
            self.moments.update(scores)
            mean, std = self.moments.mean, self.moments.std
        else:
            mean, std = 0.0, 1.0
        out = [(s - mean) / std for s in scores]
        if self.clip is not None:
            out = [max(-self.clip, min(self.clip, v)) for v in out]
        return out
