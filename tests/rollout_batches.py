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
