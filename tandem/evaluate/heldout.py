"""Held-out evaluation: generate for every held-out prompt and score with the verifier.

:func:`generate_scored` is the one generation-and-scoring pass shared by the training loop's held-out
evaluation and ``tandem eval``, so the two report identical numbers for the same weights and prompts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from tandem.data.chat import is_conversational, render_prompts, reward_inputs
from tandem.rewards import RewardSet, TrainerState
from tandem.rollout.base import RolloutEngine, SamplingParams
from tandem.types import RolloutBatch

ProgressFn = Callable[[int, int], None]


@dataclass
class ScoredRollouts:
    """Every sample of an evaluation pass with its verifier score, in prompt order (``n`` rows per prompt)."""

    batches: list[RolloutBatch]
    scores: torch.Tensor  # [N * n] float32, verifier score per sample
    lengths: torch.Tensor  # [N * n] float32, response tokens per sample
    truncated: torch.Tensor  # [N * n] bool, finish reason "length"


def generate_scored(
    engine: RolloutEngine,
    rows: list[dict[str, Any]],
    rewards: RewardSet,
    params: SamplingParams,
    *,
    batch_size: int = 64,
    on_progress: ProgressFn | None = None,
    state: TrainerState | None = None,
) -> ScoredRollouts:
    """Generate ``params.n`` answers for each row in chunks of ``batch_size`` prompts and score them.

    ``on_progress(done_prompts, total_prompts)`` is called after every chunk (progress bars); ``state``:
    the reward functions' ``trainer_state`` (a training run's held-out evaluation; None outside one).
    """
    batches, scores, lengths, truncated = [], [], [], []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        extras = [{k: v for k, v in r.items() if k != "prompt"} for r in chunk]
        prompts = [r["prompt"] for r in chunk]
        texts = render_prompts(getattr(engine, "tokenizer", None), prompts, where="evaluation prompts")
        batch = engine.generate(texts, params, extras=extras)
        batches.append(batch)
        inputs = (batch.prompts, batch.completions)
        if any(is_conversational(p) for p in prompts):  # rewards see messages, as in TRL
            inputs = reward_inputs([prompts[int(g)] for g in batch.group_ids], batch.completions)
        ids = batch.completion_ids()
        result = rewards(*inputs, batch.columns(), completion_ids=ids, trainer_state=state)
        scores.append(result.scores.float())
        lengths.append(batch.response_lengths.float())
        truncated.append(batch.truncated)
        if on_progress is not None:
            on_progress(min(start + batch_size, len(rows)), len(rows))
    if not batches:
        empty = torch.zeros(0)
        return ScoredRollouts([], empty, empty, empty.bool())
    return ScoredRollouts(batches, torch.cat(scores), torch.cat(lengths), torch.cat(truncated))


def correct(scores: torch.Tensor) -> torch.Tensor:
    """A sample is correct when its verifier score reaches the maximum 1.0. ``[N]`` -> ``[N]`` bool."""
    return scores >= 1.0 - 1e-6


def evaluate_prompts(
    engine: RolloutEngine,
    rows: list[dict[str, Any]],
    rewards: RewardSet,
    params: SamplingParams,
    *,
    batch_size: int = 64,
    prefix: str = "eval",
    state: TrainerState | None = None,
) -> dict[str, float]:
    """Greedy (or sampled, per ``params``) answers to ``rows``; accuracy = share of samples whose score
    reaches the maximum 1.0, plus mean reward, response length and the number of prompts (the noise of
    the accuracy depends on it)."""
    out = generate_scored(engine, rows, rewards, params, batch_size=batch_size, state=state)
    if out.scores.numel() == 0:
        return {}
    return {
        f"{prefix}/num_prompts": float(len(rows)),
        f"{prefix}/accuracy": float(correct(out.scores).float().mean()),
        f"{prefix}/reward_mean": float(out.scores.mean()),
        f"{prefix}/length_mean": float(out.lengths.mean()),
    }
