"""Rollout corrections: importance weights for the gap between the engine that sampled and the trainer.

The sampling engine (vLLM, or a stale rollout worker) and the trainer compute slightly different
probabilities, so samples are off-policy even at lag 0. With ``rho_t = pi_trainer(y_t) / pi_engine(y_t)``
(``old_logprobs - behavior_logprobs`` in log space) a correction returns a detached weight per token that
multiplies the per-token policy loss:

- truncated IS (TIS): weight ``min(rho, high)`` — bounded variance, small bias;
- masked IS (MIS, "IcePop"): weight ``rho`` inside ``[low, high]``, 0 outside — drops tokens the trainer
  would never have produced and importance-weights the rest;
- rejection sampling (RS): weight 1 inside ``[low, high]``, 0 outside — drops the same tokens, no
  reweighting.

The bounds apply to ``rho`` itself (verl's IcePop does the same; its ``k1`` rejection options bound
``1/rho``). Rejected tokens get weight 0 but stay in the aggregation's token count. Sequence variants use
``prod_t rho_t`` (computed as a sum of logs) broadcast to every token.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from tandem.algos.registry import Registry

CorrectionFn = Callable[[torch.Tensor, torch.Tensor, float, float], torch.Tensor]

CORRECTIONS: Registry[CorrectionFn] = Registry("rollout correction")


def correction_weights(
    kind: str,
    old_logprobs: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    mask: torch.Tensor,
    low: float | None = None,
    high: float = 2.0,
) -> torch.Tensor:
    """Detached weights ``[B, T]`` (0 on masked positions) for the registered correction ``kind``.

    ``low`` defaults to ``1 / high``; it is used only by the masked (``*_mis``) and rejection (``*_rs``)
    variants.
    """
    if high <= 0:
        raise ValueError(f"correction_high must be > 0, got {high}")
    lo = 1.0 / high if low is None else float(low)
    if not 0 <= lo <= high:
        raise ValueError(f"correction bounds need 0 <= correction_low <= correction_high, got [{lo}, {high}]")
    log_rho = (old_logprobs - behavior_logprobs).detach().float()  # [B, T]
    m = mask.to(torch.bool)
    log_rho = torch.where(m, log_rho, torch.zeros_like(log_rho))
    w = CORRECTIONS.get(kind)(log_rho, m, lo, float(high))
    return (w * m.to(w.dtype)).detach()


def _seq_log_rho(log_rho: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, T] -> [B, 1]: log prod_t rho_t over valid tokens."""
    return (log_rho * mask.to(log_rho.dtype)).sum(dim=-1, keepdim=True)


def _in_range(log_x: torch.Tensor, low: float, high: float) -> torch.Tensor:
    log_low = math.log(low) if low > 0 else -math.inf
    return (log_x >= log_low) & (log_x <= math.log(high))


@CORRECTIONS.register("token_tis")
def _token_tis(log_rho: torch.Tensor, mask: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """``min(rho_t, high)`` per token."""
    return torch.exp(log_rho.clamp(max=math.log(high)))


@CORRECTIONS.register("seq_tis")
def _seq_tis(log_rho: torch.Tensor, mask: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """``min(prod_t rho_t, high)`` broadcast over the sequence."""
    return torch.exp(_seq_log_rho(log_rho, mask).clamp(max=math.log(high))).expand_as(log_rho)


def _masked_weight(log_x: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """``x * 1[low <= x <= high]`` from ``log x`` (in range, ``x <= high``, so no overflow)."""
    keep = _in_range(log_x, low, high)
    return torch.where(keep, torch.exp(log_x.clamp(max=math.log(high))), torch.zeros_like(log_x))


@CORRECTIONS.register("token_mis")
def _token_mis(log_rho: torch.Tensor, mask: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """IcePop: ``rho_t`` where ``low <= rho_t <= high``, else 0."""
    return _masked_weight(log_rho, low, high)


@CORRECTIONS.register("seq_mis")
def _seq_mis(log_rho: torch.Tensor, mask: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """``prod_t rho_t`` for every token of sequences with ``low <= prod_t rho_t <= high``, else 0."""
    return _masked_weight(_seq_log_rho(log_rho, mask), low, high).expand_as(log_rho)


@CORRECTIONS.register("token_rs")
def _token_rs(log_rho: torch.Tensor, mask: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """Token rejection: 1 where ``low <= rho_t <= high``, else 0 (no reweighting)."""
    return _in_range(log_rho, low, high).to(log_rho.dtype)


@CORRECTIONS.register("seq_rs")
def _seq_rs(log_rho: torch.Tensor, mask: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """Sequence rejection: 1 for every token of sequences with ``low <= prod_t rho_t <= high``, else 0."""
    return _in_range(_seq_log_rho(log_rho, mask), low, high).to(log_rho.dtype).expand_as(log_rho)
