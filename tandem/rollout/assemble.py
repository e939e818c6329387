"""Turning an engine's raw samples into a :class:`~tandem.types.RolloutBatch`, the same way for every engine.

Engines differ in how they sample; the row layout (a prompt's ``n`` samples consecutive, group ids,
versions, sample ids, extras) and the completion text (decoded with the run's tokenizer, special tokens
skipped, stop strings cut) must not, or rewards would differ between engines on the same tokens.
"""

from __future__ import annotations

import uuid
from typing import Any

import torch

from tandem.rollout.stops import StopStrings
from tandem.types import RolloutBatch


def repeats(counts: list[int]) -> int | torch.Tensor:
    """``repeat_interleave`` argument for ``counts`` rows per prompt (an int when they are all equal)."""
    return counts[0] if len(set(counts)) == 1 else torch.tensor(counts)


def completion_texts(tokenizer: Any, rows: list[list[int]], cut: list[StopStrings | None]) -> list[str]:
    """Decoded completions (special tokens skipped), each cut at its row's first stop string."""
    texts = tokenizer.batch_decode(rows, skip_special_tokens=True)
    return [text if s is None else s.cut(text)[0] for text, s in zip(texts, cut, strict=True)]


def assemble_batch(
    *,
    prompts: list[str],
    counts: list[int],  # rows per prompt
    prompt_ids: torch.Tensor,  # [B, P] long, left padded, one row per sample
    prompt_mask: torch.Tensor,  # [B, P] bool
    tokens: torch.Tensor,  # [B, R] long, pad after each row's end
    logprobs: torch.Tensor,  # [B, R] float32, 0 after each row's end
    lengths: torch.Tensor,  # [B] long
    stopped: list[bool],  # [B] ended by EOS or a stop string
    texts: list[str],  # [B]
    group_offset: int,
    extras: list[dict] | None,
    version: int,
) -> RolloutBatch:
    """The RolloutBatch of one engine call (tensors copied to the CPU)."""
    B = prompt_ids.shape[0]
    tokens, lengths = tokens.to("cpu", copy=True), lengths.to("cpu", copy=True)
    response_mask = torch.arange(tokens.shape[1]).unsqueeze(0) < lengths.unsqueeze(1)  # [B, R]
    groups = torch.arange(len(prompts), dtype=torch.long).repeat_interleave(repeats(counts)) + group_offset
    gids = [group_offset + i for i in range(len(prompts))]
    tag = uuid.uuid4().hex[:8]
    return RolloutBatch(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        response_ids=tokens,
        response_mask=response_mask,
        behavior_logprobs=logprobs.to("cpu", dtype=torch.float32, copy=True),
        group_ids=groups,
        policy_version=torch.full((B,), version, dtype=torch.long),
        prompts=[p for p, n in zip(prompts, counts, strict=True) for _ in range(n)],
        completions=texts,
        finish_reasons=["stop" if s else "length" for s in stopped],
        sample_ids=[f"{tag}-{version}-{g}-{k}" for g, n in zip(gids, counts, strict=True) for k in range(n)],
        extras=[
            dict(e) for e, n in zip(extras or [{}] * len(prompts), counts, strict=True) for _ in range(n)
        ],
    )
