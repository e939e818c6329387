"""DAPO pieces: dynamic sampling (drop groups with identical rewards) and overlong reward shaping."""

from __future__ import annotations

import torch


def filter_groups(
    scores: torch.Tensor, group_ids: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, float]:
    """Keep the samples of groups whose scores are not all equal (their GRPO advantage is non-zero).

    scores ``[B]``, group_ids ``[B]`` -> (keep mask ``[B]`` bool, kept fraction of groups).
    Groups of size 1 are dropped (they carry no group-relative signal).
    """
    uniq, inverse = torch.unique(group_ids, return_inverse=True)
    g = uniq.numel()
    s = scores.float()
    gmax = torch.full((g,), -float("inf"), dtype=s.dtype).scatter_reduce(0, inverse, s, reduce="amax")
    gmin = torch.full((g,), float("inf"), dtype=s.dtype).scatter_reduce(0, inverse, s, reduce="amin")
    keep_group = (gmax - gmin) > eps
    kept = float(keep_group.float().mean()) if g else 0.0
    return keep_group[inverse], kept


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
