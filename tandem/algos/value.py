"""Critic (value-function) loss and its diagnostic, explained variance."""

from __future__ import annotations

import torch

from tandem.algos.aggregation import aggregate
from tandem.algos.core import masked_mean, masked_var


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip: float | None = None,
    global_tokens: float | None = None,
) -> tuple[torch.Tensor, float]:
    """``0.5 * token-mean((V - R)^2)``; with ``clip = c`` the PPO pessimistic form
    ``0.5 * max((V - R)^2, (old + clip(V - old, -c, c) - R)^2)``, which stops the critic moving more
    than ``c`` from its pre-update value on any token. values, old_values, returns, mask ``[B, T]`` ->
    (scalar loss, fraction of valid tokens where the clipped term was the larger)."""
    err = (values - returns) ** 2  # [B, T]
    if clip is None:
        return 0.5 * aggregate(err, mask, "token-mean", global_tokens), 0.0
    if clip <= 0:
        raise ValueError(f"value clip must be > 0, got {clip}")
    old = old_values.detach()
    clipped = old + (values - old).clamp(-clip, clip)
    err_clipped = (clipped - returns) ** 2
    loss = 0.5 * aggregate(torch.maximum(err, err_clipped), mask, "token-mean", global_tokens)
    clipfrac = float(masked_mean((err_clipped > err).float(), mask.to(torch.bool)))
    return loss, clipfrac


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """``1 - Var(R - V) / Var(R)`` over valid tokens: 1 is a perfect critic, 0 no better than the mean,
    negative worse. NaN when the returns are constant (undefined)."""
    m = mask.to(torch.bool)
    var_r = masked_var(returns.detach().float(), m)
    if float(var_r) == 0.0:
        return float("nan")
    return float(1.0 - masked_var((returns - values).detach().float(), m) / var_r)
