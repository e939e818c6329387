"""Preference losses: DPO and its variants, and the Bradley–Terry reward-model loss.

DPO variants share the margin ``h = (log pi(y+) - log pi_ref(y+)) - (log pi(y-) - log pi_ref(y-))``
(log-probs summed over completion tokens) and differ only in the function of ``beta * h`` they
minimise, so each is a registered ``fn(h, beta, label_smoothing) -> losses [B]``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from tandem.algos.registry import Registry

PreferenceFn = Callable[[torch.Tensor, float, float], torch.Tensor]

PREFERENCE_LOSSES: Registry[PreferenceFn] = Registry("preference loss")


def dpo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    beta: float = 0.1,
    loss_type: str = "sigmoid",
    label_smoothing: float = 0.0,
    *,
    lengths: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-pair losses ``[B]`` and detached implicit rewards ``beta * (log pi - log pi_ref)`` for the
    chosen and rejected completions ``[B]``. Inputs: summed completion log-probs ``[B]``.

    ``lengths = (chosen_tokens [B], rejected_tokens [B])`` length-normalises the margin: each log-ratio is
    divided by its completion's token count before the difference is taken. That is TRL's ``ipo`` (the
    form the IPO authors used) and TRL's ``sigmoid_norm``; without it the margin uses summed log-ratios.
    The implicit rewards stay summed either way.
    """
    if beta <= 0:
        raise ValueError(f"dpo beta must be > 0, got {beta}")
    fn = PREFERENCE_LOSSES.get(loss_type)
    chosen_logratio = policy_chosen_logps - ref_chosen_logps  # [B]
    rejected_logratio = policy_rejected_logps - ref_rejected_logps  # [B]
    margin = chosen_logratio - rejected_logratio  # [B]
    if lengths is not None:
        if any(tuple(n.shape) != tuple(margin.shape) for n in lengths):
            shapes = [tuple(n.shape) for n in lengths]
            raise ValueError(f"dpo lengths must be two [B]={tuple(margin.shape)} tensors, got {shapes}")
        n_chosen, n_rejected = (n.to(chosen_logratio.dtype).clamp(min=1.0) for n in lengths)
        margin = chosen_logratio / n_chosen - rejected_logratio / n_rejected
    losses = fn(margin, beta, label_smoothing)
    return losses, beta * chosen_logratio.detach(), beta * rejected_logratio.detach()


@PREFERENCE_LOSSES.register("sigmoid")
def _sigmoid(h: torch.Tensor, beta: float, eps: float) -> torch.Tensor:
    """DPO (Rafailov et al. 2023): ``-log sigmoid(beta h)``; with ``eps > 0`` the conservative cDPO
    mixture ``-(1 - eps) log sigmoid(beta h) - eps log sigmoid(-beta h)`` (labels flipped w.p. eps)."""
    return -(1.0 - eps) * F.logsigmoid(beta * h) - eps * F.logsigmoid(-beta * h)


@PREFERENCE_LOSSES.register("ipo")
def _ipo(h: torch.Tensor, beta: float, eps: float) -> torch.Tensor:
    """IPO (Azar et al. 2023): ``(h - 1 / (2 beta))^2`` — regresses the margin to a finite target."""
    return (h - 1.0 / (2.0 * beta)) ** 2


@PREFERENCE_LOSSES.register("hinge")
def _hinge(h: torch.Tensor, beta: float, eps: float) -> torch.Tensor:
    """SLiC-style hinge: ``relu(1 - beta h)``."""
    return torch.relu(1.0 - beta * h)


@PREFERENCE_LOSSES.register("robust")
def _robust(h: torch.Tensor, beta: float, eps: float) -> torch.Tensor:
    """Robust DPO (Chowdhury et al. 2024), unbiased under label-flip rate ``eps < 0.5``:
    ``(-(1 - eps) log sigmoid(beta h) + eps log sigmoid(-beta h)) / (1 - 2 eps)``."""
    if not 0 <= eps < 0.5:
        raise ValueError(f"robust DPO needs 0 <= label_smoothing < 0.5, got {eps}")
    return (-(1.0 - eps) * F.logsigmoid(beta * h) + eps * F.logsigmoid(-beta * h)) / (1.0 - 2.0 * eps)


def reward_model_loss(
    chosen: torch.Tensor,
    rejected: torch.Tensor,
    margin: torch.Tensor | None = None,
    center_coef: float | None = None,
) -> torch.Tensor:
    """Bradley–Terry reward-model loss, mean over pairs: ``-log sigmoid(r+ - r- - margin)``; with
    ``center_coef = c`` adds ``c * mean((r+ + r-)^2)`` to keep rewards centred on 0 (Eisenstein et al.
    2023). chosen, rejected, margin ``[B]`` -> scalar."""
    diff = chosen - rejected  # [B]
    if margin is not None:
        diff = diff - margin
    loss = -F.logsigmoid(diff).mean()
    if center_coef:
        loss = loss + center_coef * ((chosen + rejected) ** 2).mean()
    return loss
