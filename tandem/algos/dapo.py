"""DAPO pieces: dynamic sampling (drop groups with identical rewards) and overlong reward shaping; the
per-group outcomes they rest on, shared with the advantage-degeneracy metrics and the prompt curriculum."""

from __future__ import annotations

import torch


def group_outcomes(
    scores: torch.Tensor, group_ids: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per group: its id, mean score and whether its scores are all equal (a zero GRPO advantage).

    scores ``[B]``, group_ids ``[B]`` -> (ids ``[G]`` sorted, inverse ``[B]`` (sample -> group index),
    mean ``[G]`` float32, all_equal ``[G]`` bool). A group of size 1 counts as all equal.
    Naive equivalent: ``for g in ids: s = scores[group_ids == g]; (s.mean(), s.max() - s.min() <= eps)``.
    """
    uniq, inverse = torch.unique(group_ids, return_inverse=True)
    g = uniq.numel()
    s = scores.float()
    gmax = torch.full((g,), -float("inf"), dtype=s.dtype).scatter_reduce(0, inverse, s, reduce="amax")
    gmin = torch.full((g,), float("inf"), dtype=s.dtype).scatter_reduce(0, inverse, s, reduce="amin")
    count = torch.zeros(g, dtype=s.dtype).index_add_(0, inverse, torch.ones_like(s))
    mean = torch.zeros(g, dtype=s.dtype).index_add_(0, inverse, s) / count.clamp(min=1)
    return uniq, inverse, mean, (gmax - gmin) <= eps


def filter_groups(
    scores: torch.Tensor, group_ids: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, float]:
    """Keep the samples of groups whose scores are not all equal (their GRPO advantage is non-zero).

    scores ``[B]``, group_ids ``[B]`` -> (keep mask ``[B]`` bool, kept fraction of groups).
    Groups of size 1 are dropped (they carry no group-relative signal).
    """
    _, inverse, _, all_equal = group_outcomes(scores, group_ids, eps)
    keep_group = ~all_equal
    kept = float(keep_group.float().mean()) if keep_group.numel() else 0.0
    return keep_group[inverse], kept


def zero_advantage_groups(
    advantages: torch.Tensor, mask: torch.Tensor, group_ids: torch.Tensor
) -> torch.Tensor:
    """Rows whose whole group has an advantage of exactly 0 on every valid token (under GRPO, RLOO or
    Dr. GRPO: a group whose rewards are all equal). Under a loss that is a multiple of the advantage
    (``PolicyLossSpec.inert_at_zero_advantage``) and no KL, entropy or SFT term, such rows add exactly
    nothing to the loss or its gradient, so the learner may leave them out of its forward and backward.
    Whole groups, so the rows left keep the prompt-sharing group layout.

    advantages ``[B, T]``, mask ``[B, T]``, group_ids ``[B]`` -> ``[B]`` bool. A NaN advantage counts as
    non-zero (the row is kept, and the non-finite gradient is caught as before)."""
    if group_ids.numel() == 0:
        return torch.zeros(0, dtype=torch.bool)
    live = ((advantages != 0) & mask.to(torch.bool)).any(dim=-1)  # [B]
    _, inverse = torch.unique(group_ids, return_inverse=True)
    per_group = torch.zeros(int(inverse.max()) + 1, dtype=torch.long).index_add_(0, inverse, live.long())
    return per_group[inverse] == 0


def degeneracy_metrics(scores: torch.Tensor, group_ids: torch.Tensor, eps: float = 1e-6) -> dict[str, float]:
    """How much of a batch carries no group-relative signal (logged every step).

    ``groups/all_equal_frac``: share of groups whose scores are all equal (zero GRPO/RLOO advantage:
    the update learns nothing from them); split into ``groups/all_equal_high_frac`` (the shared score is
    above 0: for a 0/1 verifier, every sample solved it) and ``groups/all_equal_low_frac`` (at or below
    0: for a 0/1 verifier, none did). Empty batch -> ``{}``.
    """
    if scores.numel() == 0:
        return {}
    _, _, mean, all_equal = group_outcomes(scores, group_ids, eps)
    high = all_equal & (mean > eps)
    g = float(all_equal.numel())
    return {
        "groups/all_equal_frac": float(all_equal.sum()) / g,
        "groups/all_equal_high_frac": float(high.sum()) / g,
        "groups/all_equal_low_frac": float((all_equal & ~high).sum()) / g,
    }


def overlong_penalty(lengths: torch.Tensor, max_len: int, buffer: int, factor: float = 1.0) -> torch.Tensor:
    """DAPO's soft overlong punishment, added to the sequence reward.

    0 when ``len <= max_len - buffer``; linear from 0 to ``-factor`` over the last ``buffer`` tokens;
    ``-factor`` beyond ``max_len``. lengths ``[B]`` -> ``[B]`` float32.
    """
    lengths = lengths.float()
    if buffer <= 0:
        return torch.where(lengths > max_len, -float(factor), 0.0)
    start = max_len - buffer
    frac = ((lengths - start) / buffer).clamp(min=0.0, max=1.0)
    return -float(factor) * frac
