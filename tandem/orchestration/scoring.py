"""Score a rollout batch: reward functions (TRL signature), optional DAPO overlong shaping; DAPO dynamic
sampling (:func:`collect_dynamic`), shared by the colocated trainer and the decoupled rollout workers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from tandem.algos import filter_groups
from tandem.config.schema import TandemConfig
from tandem.rewards import RewardSet, TrainerState, overlong_shaping
from tandem.types import RolloutBatch, concat_rollouts


@dataclass(frozen=True)
class OverlongShaping:
    max_len: int
    buffer: int
    factor: float


def trainer_state(cfg: TandemConfig, step: int, train_rows: int) -> TrainerState:
    """The run's progress that reward functions see as ``trainer_state`` when step ``step``'s batch (or
    the held-out evaluation after ``step`` steps) is scored; ``train_rows``: prompts in the training file."""
    drawn = step * cfg.data.prompts_per_step
    return TrainerState(step, cfg.trainer.total_steps, drawn / train_rows if train_rows else 0.0)


def score_rollout(
    rollout: RolloutBatch,
    rewards: RewardSet,
    overlong: OverlongShaping | None = None,
    *,
    inputs: tuple[list[Any], list[Any]] | None = None,
    state: TrainerState | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Sequence scores ``[B]`` and reward metrics (``reward/<fn>/mean``, ``reward/overlong_mean``, ...).

    ``inputs``: the ``(prompts, completions)`` the reward functions see instead of the batch's texts, one
    per sample (conversational data: messages, see :func:`tandem.data.chat.reward_inputs`); ``state``: the
    functions' ``trainer_state`` (:func:`trainer_state`)."""
    prompts, completions = inputs if inputs is not None else (rollout.prompts, rollout.completions)
    ids = rollout.completion_ids()
    result = rewards(prompts, completions, rollout.columns(), completion_ids=ids, trainer_state=state)
    scores = result.scores.float()
    metrics = dict(result.metrics)
    if overlong is not None:
        penalty = overlong_shaping(
            rollout.response_lengths, overlong.max_len, overlong.buffer, overlong.factor
        )
        metrics["reward/overlong_mean"] = float(penalty.mean())
        scores = scores + penalty
    return scores, metrics


def collect_dynamic(
    first: tuple[RolloutBatch, torch.Tensor],
    more: Callable[[int], tuple[RolloutBatch, torch.Tensor]],
    *,
    want: int,
    max_rounds: int,
    pad_token_id: int,
) -> tuple[RolloutBatch, torch.Tensor, dict[str, float]]:
    """DAPO dynamic sampling: keep only groups whose scores are not all equal (zero GRPO advantage
    otherwise) and generate more rounds — ``more(round_)`` for ``round_ = 1..max_rounds`` — until
    ``want`` samples are kept. Returns at most ``want`` samples (possibly none: nothing informative was
    found; the caller then skips the update) and ``dapo/kept_frac``, ``dapo/rounds``."""
    kept_b, kept_s, seen, kept = [], [], 0, 0
    batch, scores = first
    round_ = 0
    for round_ in range(max_rounds + 1):
        if round_ > 0:
            batch, scores = more(round_)
        keep, _ = filter_groups(scores, batch.group_ids)
        seen += batch.batch_size
        idx = keep.nonzero().squeeze(1)
        kept_b.append(batch.select(idx))
        kept_s.append(scores[idx])
        kept += idx.numel()
        if kept >= want:
            break
    metrics = {"dapo/kept_frac": kept / max(1, seen), "dapo/rounds": float(round_ + 1)}
    if kept == 0:
        return batch.select(torch.arange(0)), scores[:0], metrics
    out = concat_rollouts(kept_b, pad_token_id)
    return out.select(torch.arange(min(kept, want))), torch.cat(kept_s)[:want], metrics
