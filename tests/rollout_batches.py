"""Small hand-built :class:`~tandem.types.RolloutBatch` fixtures for tests of the code around a batch."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from tandem.types import RolloutBatch


def constant_batch(gids: list[int], completions: list[str] | None = None, **fields: Any) -> RolloutBatch:
    """One row per entry of ``gids`` (its group id): prompt ``[5, 5]``, response ``[6]``, behaviour log-prob
    -1, prompt text ``p<gid>``, ``completions`` (default ``c``); ``fields`` replace any other field."""
    B = len(gids)
    batch = RolloutBatch(
        prompt_ids=torch.full((B, 2), 5),
        prompt_mask=torch.ones(B, 2, dtype=torch.bool),
        response_ids=torch.full((B, 1), 6),
        response_mask=torch.ones(B, 1, dtype=torch.bool),
        behavior_logprobs=torch.full((B, 1), -1.0),
        group_ids=torch.tensor(gids, dtype=torch.long),
        policy_version=torch.zeros(B, dtype=torch.long),
        prompts=[f"p{g}" for g in gids],
        completions=["c"] * B if completions is None else completions,
        finish_reasons=["stop"] * B,
        sample_ids=[str(i) for i in range(B)],
        extras=[{} for _ in range(B)],
    )
    return replace(batch, **fields)


def sampled_batch(
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    lengths: torch.Tensor,
    R: int,
    n: int,
    g: torch.Generator,
    finish_reasons: list[str] | None = None,
) -> RolloutBatch:
    """Groups of ``n`` rows with the given prompts ``[B, P]`` and response ``lengths`` ``[B]`` (of ``R``
    slots): random response tokens (4..39) and behaviour log-probs drawn from ``g``, in that order."""
    B = len(lengths)
    mask = torch.arange(R)[None, :] < lengths[:, None]  # [B, R]
    return RolloutBatch(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        response_ids=torch.randint(4, 40, (B, R), generator=g) * mask,
        response_mask=mask,
        behavior_logprobs=-torch.rand(B, R, generator=g) * mask,
        group_ids=torch.arange(B) // n,
        policy_version=torch.zeros(B, dtype=torch.long),
        prompts=["p"] * B,
        completions=["c"] * B,
        finish_reasons=finish_reasons or ["stop"] * B,
    )


def groups_batch(B: int = 12, n: int = 4, P: int = 3, R: int = 5, seed: int = 0) -> RolloutBatch:
    """:func:`sampled_batch` of ``B // n`` groups of ``n`` rows sharing a random prompt of ``P`` tokens,
    random response lengths below ``R``, all stopped; drawn from a generator seeded with ``seed``."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, R, (B,), generator=g)
    prompts = torch.randint(4, 40, (B // n, P), generator=g).repeat_interleave(n, dim=0)
    return sampled_batch(prompts, torch.ones(B, P, dtype=torch.bool), lengths, R, n, g, ["stop"] * B)
