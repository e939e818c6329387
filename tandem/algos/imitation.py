"""Auxiliary imitation (SFT) terms: on the batch's own successful samples (``algorithm.sft_coef``), and on
the prompt file's reference answers (``rollout.reference_answers.mode=imitate``, :func:`reference_nll`).

RAFT / expert iteration (Dong et al. 2023; Anthony et al. 2017) train on the samples that scored well;
added beside a policy-gradient loss it is ``sft_coef · NLL`` of the tokens of every sample whose sequence
reward reaches ``min_score``. Unlike a group-relative advantage it also learns from groups whose samples
all succeeded (their GRPO advantage is zero), and it pulls the greedy mode toward a correct answer
directly rather than through a ratio of rewards.

Normalisation: the mean over *successful* tokens of the mini-batch (``success_tokens``, counted once
before micro-batching), so micro-batch sums add up to one mean and the term's strength does not depend
on how many samples succeeded; it is 0 (and has no gradient) when none did.
"""

from __future__ import annotations

import torch


def success_mask(scores: torch.Tensor, response_mask: torch.Tensor, min_score: float) -> torch.Tensor:
    """Response tokens of the samples whose sequence reward is ``>= min_score``.
    ``scores`` ``[B]``, ``response_mask`` ``[B, T]`` -> ``[B, T]`` bool."""
    return response_mask.to(torch.bool) & (scores >= min_score).unsqueeze(1)


def success_tokens(scores: torch.Tensor, response_mask: torch.Tensor, min_score: float) -> int:
    """Number of response tokens in successful samples (the term's normaliser for a whole mini-batch)."""
    return int(success_mask(scores, response_mask, min_score).sum())


def success_nll(
    logprobs: torch.Tensor,
    response_mask: torch.Tensor,
    scores: torch.Tensor,
    min_score: float,
    global_tokens: int | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Negative log-likelihood of the successful samples' tokens: ``-sum(logprobs over successful
    tokens) / global_tokens`` (default: this batch's successful tokens). ``logprobs`` ``[B, T]`` carries
    gradient; ``scores`` ``[B]``. Returns the scalar loss and the metric ``sft_frac`` (share of the
    samples with a response that count as successful)."""
    mask = success_mask(scores.detach(), response_mask, min_score)  # [B, T]
    count = int(mask.sum()) if global_tokens is None else global_tokens
    total = -(logprobs * mask.to(logprobs.dtype)).sum()
    loss = total / max(count, 1)
    rows = response_mask.to(torch.bool).any(dim=1)  # [B] samples with a response
    frac = (mask.any(dim=1) & rows).float().sum() / rows.float().sum().clamp(min=1.0)
    return loss, {"sft_frac": frac}


def reference_nll(
    logprobs: torch.Tensor, response_mask: torch.Tensor, reference: torch.Tensor, global_tokens: int
) -> torch.Tensor:
    """Negative log-likelihood of the reference rows' tokens (``rollout.reference_answers.mode=imitate``):
    ``-sum(logprobs over the tokens of rows where reference) / global_tokens`` (the mini-batch's reference
    tokens). ``logprobs`` ``[B, T]`` carries gradient, ``reference`` ``[B]`` bool; 0 without such rows."""
    mask = response_mask.to(torch.bool) & reference.to(torch.bool).unsqueeze(1)  # [B, T]
    return -(logprobs * mask.to(logprobs.dtype)).sum() / max(global_tokens, 1)
