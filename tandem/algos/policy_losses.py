"""Per-token policy losses behind one signature.

Each registered loss maps :class:`PolicyLossInputs` to ``(loss_matrix [B, T], metrics)``: a per-token
loss to *minimise* (before rollout correction, KL term and aggregation, which :func:`policy_loss` adds)
and scalar tensor metrics. Notation: ``A`` advantage, ``r = pi_theta / pi_old`` per token (``old`` is
the proximal policy recomputed by the trainer), ``mu`` the behaviour policy that sampled.

Losses whose gradient is ``-w * A * grad log pi`` with a detached weight ``w`` use the straight-through
form ``-w * A * exp(log pi - sg(log pi))``: same gradient, and the reported value is ``-w * A``.

A loss with hyper-parameters declares them as a frozen dataclass (its ``options``); each field's
``metadata`` holds its ``description`` and bounds (``ge``/``gt``/``le``/``lt``), from which the config
builds the model that validates ``algorithm.loss_options``. The loss reads them as ``x.options``. So a new
loss with a new hyper-parameter is one registered function plus its options class, and its docs entry.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch

from tandem.algos.core import group_stats, masked_mean, sequence_sum
from tandem.algos.registry import Registry

_LOG_RATIO_LIMIT = 20.0  # exp(20) ~ 5e8; keeps ratios finite for extreme log-prob gaps


@dataclass(frozen=True)
class PolicyLossInputs:
    """Everything a policy loss may use. ``B`` samples, ``T`` response tokens."""

    logprobs: torch.Tensor  # [B, T] float, current policy, requires grad
    old_logprobs: torch.Tensor  # [B, T] float, proximal policy (trainer, before this step's updates)
    advantages: torch.Tensor  # [B, T] float
    response_mask: torch.Tensor  # [B, T] bool
    options: Any = None  # the loss's options (an instance of its spec's ``options`` class), or None
    behavior_logprobs: torch.Tensor | None = None  # [B, T] float, engine that sampled
    ref_logprobs: torch.Tensor | None = None  # [B, T] float, reference policy
    scores: torch.Tensor | None = None  # [B] float, sequence reward
    group_ids: torch.Tensor | None = None  # [B] long
    beta: float = 0.0
    weight_cap: float = 2.0  # truncation of the behaviour weight (decoupled_ppo)


LossFn = Callable[[PolicyLossInputs], tuple[torch.Tensor, dict[str, torch.Tensor]]]


@dataclass(frozen=True)
class ClipOptions:
    """PPO-style clipping of the ratio to ``[1 - clip_low, 1 + clip_high]``, optionally dual-clipped."""

    clip_low: float = field(default=0.2, metadata={"ge": 0, "description": "PPO clip ε_low."})
    clip_high: float = field(
        default=0.2, metadata={"ge": 0, "description": "PPO clip ε_high (DAPO clip-higher: 0.28)."}
    )
    dual_clip: float | None = field(
        default=None,
        metadata={"gt": 1, "description": "Dual-clip constant c for negative advantages (null = off)."},
    )


@dataclass(frozen=True)
class WeightClipOptions:
    """Bounds ``[1 - clip_low, 1 + clip_high]`` of a clipped, detached importance weight (CISPO)."""

    clip_low: float = field(default=0.2, metadata={"ge": 0, "description": "Weight clip ε_low."})
    clip_high: float = field(default=0.2, metadata={"ge": 0, "description": "Weight clip ε_high."})


@dataclass(frozen=True)
class PolicyLossSpec:
    """A registered loss and what the trainer must know about it.

    ``requires``: optional inputs it cannot work without. ``owns_kl``: it uses ``beta`` and
    ``ref_logprobs`` itself, so no separate KL term is added. ``owns_behavior_correction``: it already
    reweights by the behaviour policy, so a rollout correction must not be stacked on top.
    ``needs_whole_groups``: every sample of a group must be in the same micro-batch.
    ``off_policy_safe``: it stays stable on samples several policy versions old (staleness η ≥ 2)
    without a rollout correction. ``inert_at_zero_advantage``: every token's loss is a multiple of its
    advantage, so a row with advantage 0 adds nothing to the loss or its gradient (the learner may skip
    it, ``trainer.skip_zero_advantage``); False for a loss that reads rewards itself. ``options``: the
    frozen dataclass of its hyper-parameters (None: it has none); :meth:`make_options` builds one.
    """

    fn: LossFn
    requires: tuple[str, ...] = ()
    owns_kl: bool = False
    owns_behavior_correction: bool = False
    needs_whole_groups: bool = False
    off_policy_safe: bool = False
    options: type | None = None
    inert_at_zero_advantage: bool = False

    def option_names(self) -> list[str]:
        """Names of the loss's hyper-parameters, in declaration order."""
        return [f.name for f in fields(self.options)] if self.options is not None else []

    def make_options(self, options: object | None = None, **values: Any) -> Any:
        """The loss's options: ``options`` (an instance of :attr:`options`, defaults when None) with
        ``values`` replacing fields of the same name. A name the loss lacks is a ValueError listing its
        options; a loss without options returns None."""
        unknown = sorted(set(values) - set(self.option_names()))
        if unknown:
            valid = ", ".join(self.option_names()) or "none"
            raise ValueError(f"unknown option {', '.join(unknown)}; this loss's options: {valid}")
        if self.options is None:
            if options is not None:
                raise ValueError(f"this loss takes no options, got {type(options).__name__}")
            return None
        if options is None:
            return self.options(**values)
        if not isinstance(options, self.options):
            raise ValueError(f"options must be a {self.options.__name__}, got {type(options).__name__}")
        return replace(options, **values) if values else options


POLICY_LOSSES: Registry[PolicyLossSpec] = Registry("policy loss", PolicyLossSpec)


def _register(
    name: str,
    requires: tuple[str, ...] = (),
    owns_kl: bool = False,
    owns_behavior_correction: bool = False,
    needs_whole_groups: bool = False,
    off_policy_safe: bool = False,
    options: type | None = None,
    inert_at_zero_advantage: bool = False,
) -> Callable[[LossFn], LossFn]:
    def deco(fn: LossFn) -> LossFn:
        spec = PolicyLossSpec(
            fn,
            requires,
            owns_kl,
            owns_behavior_correction,
            needs_whole_groups,
            off_policy_safe,
            options,
            inert_at_zero_advantage,
        )
        POLICY_LOSSES.add(name, spec)
        return fn

    return deco


def _straight_through(logprobs: torch.Tensor) -> torch.Tensor:
    """``exp(log pi - sg(log pi))``: equals 1, gradient ``grad log pi``."""
    return torch.exp(logprobs - logprobs.detach())


def _frac(cond: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return masked_mean(cond.float(), mask)


def clipped_surrogate(
    ratio: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's pessimistic clipped surrogate per token, optionally dual-clipped.

    ``max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))``; with ``dual_clip = c > 1`` and ``A < 0`` the
    loss is further capped at ``-c A`` (Ye et al. 2020), bounding the update when ``r`` is huge.
    """
    loss1 = -adv * ratio
    loss2 = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(loss1, loss2)
    metrics = {
        "clipfrac_high": _frac((adv > 0) & (ratio > 1.0 + clip_high), mask),
        "clipfrac_low": _frac((adv < 0) & (ratio < 1.0 - clip_low), mask),
    }
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1 (typically 3), got {dual_clip}")
        loss3 = -adv * dual_clip
        dual = (adv < 0) & (loss3 < loss)
        loss = torch.where(adv < 0, torch.minimum(loss, loss3), loss)
        metrics["clipfrac_dual"] = _frac(dual, mask)
    metrics["clipfrac"] = metrics["clipfrac_high"] + metrics["clipfrac_low"]
    return loss, metrics


def _log_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor) -> torch.Tensor:
    return (logprobs - old_logprobs).clamp(-_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT)


@_register("ppo_clip", options=ClipOptions, inert_at_zero_advantage=True)
def _ppo_clip(x: PolicyLossInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clip with asymmetric bounds (DAPO clip-higher) and optional dual clip."""
    o: ClipOptions = x.options
    ratio = torch.exp(_log_ratio(x.logprobs, x.old_logprobs))
    return clipped_surrogate(ratio, x.advantages, x.response_mask, o.clip_low, o.clip_high, o.dual_clip)


@_register(
    "decoupled_ppo",
    requires=("behavior_logprobs",),
    owns_behavior_correction=True,
    off_policy_safe=True,
    options=ClipOptions,
    inert_at_zero_advantage=True,
)
def _decoupled_ppo(x: PolicyLossInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """AReaL: ``w * ppo_clip(u)`` with ``u = pi/pi_prox`` and ``w = min(pi_prox/mu, weight_cap)`` detached."""
    assert x.behavior_logprobs is not None
    u = torch.exp(_log_ratio(x.logprobs, x.old_logprobs))
    if x.weight_cap <= 0:
        raise ValueError(f"decoupled_ppo weight cap (correction_high) must be > 0, got {x.weight_cap}")
    log_w = (x.old_logprobs - x.behavior_logprobs).detach()
    w = torch.exp(log_w.clamp(min=-_LOG_RATIO_LIMIT, max=math.log(x.weight_cap)))  # [B, T]
    o: ClipOptions = x.options
    loss, metrics = clipped_surrogate(u, x.advantages, x.response_mask, o.clip_low, o.clip_high, o.dual_clip)
    metrics.update(_weight_metrics(w, x.response_mask, x.weight_cap))
    return w * loss, metrics


@_register("gspo", options=ClipOptions, inert_at_zero_advantage=True)
def _gspo(x: PolicyLossInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GSPO: sequence ratio ``s = exp(mean_t log r_t)`` clipped PPO-style (token form: value ``s``,
    gradient ``s * grad log pi_t``, so ``seq-mean-token-mean`` reproduces the sequence objective)."""
    o: ClipOptions = x.options
    m = x.response_mask.to(x.logprobs.dtype)
    log_r = (x.logprobs - x.old_logprobs) * m  # [B, T]
    seq_log_r = log_r.sum(dim=-1) / m.sum(dim=-1).clamp(min=1.0)  # [B]
    seq_log_r = seq_log_r.clamp(-_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT)
    token_log_s = seq_log_r.detach().unsqueeze(-1) + x.logprobs - x.logprobs.detach()  # [B, T]
    return clipped_surrogate(
        torch.exp(token_log_s), x.advantages, x.response_mask, o.clip_low, o.clip_high, o.dual_clip
    )


@_register("cispo", options=WeightClipOptions, inert_at_zero_advantage=True)
def _cispo(x: PolicyLossInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """CISPO (MiniMax-M1): ``-sg(clip(r, 1 - clip_low, 1 + clip_high)) * A * log pi``; clipping the weight
    instead of the objective keeps a gradient on every token."""
    ratio = torch.exp(_log_ratio(x.logprobs, x.old_logprobs)).detach()
    o: WeightClipOptions = x.options
    w = ratio.clamp(1.0 - o.clip_low, 1.0 + o.clip_high)
    loss = -w * x.advantages * _straight_through(x.logprobs)
    metrics = {
        "clipfrac_high": _frac(ratio > 1.0 + o.clip_high, x.response_mask),
        "clipfrac_low": _frac(ratio < 1.0 - o.clip_low, x.response_mask),
    }
    metrics["clipfrac"] = metrics["clipfrac_high"] + metrics["clipfrac_low"]
    return loss, metrics


@_register("topr", off_policy_safe=True, inert_at_zero_advantage=True)
def _topr(x: PolicyLossInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Tapered off-policy REINFORCE: weight 1 where ``A >= 0``; ``clip(pi(y)/mu(y), 0, 1)`` (sequence
    ratio, detached) where ``A < 0``; loss ``-w * A * log pi``. ``mu`` = behaviour log-probs if given,
    else ``old_logprobs``."""
    mu = x.behavior_logprobs if x.behavior_logprobs is not None else x.old_logprobs
    seq_log_ratio = sequence_sum(x.logprobs.detach() - mu, x.response_mask)  # [B]
    taper = torch.exp(seq_log_ratio.clamp(max=0.0, min=-100.0)).unsqueeze(-1)  # [B, 1] in (0, 1]
    neg = x.advantages < 0
    w = torch.where(neg, taper.expand_as(x.advantages), torch.ones_like(x.advantages))  # [B, T]
    loss = -w * x.advantages * _straight_through(x.logprobs)
    metrics = {
        "topr_neg_frac": _frac(neg, x.response_mask),
        "topr_neg_weight_mean": masked_mean(w, x.response_mask & neg),
    }
    return loss, metrics


@_register(
    "agro", requires=("scores", "group_ids"), owns_kl=True, needs_whole_groups=True, off_policy_safe=True
)
def _agro(x: PolicyLossInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """AGRO: regularised reward ``R~ = R - beta * log(pi(y)/pi_ref(y))`` (sequence log-ratio, detached),
    advantage ``R~ - group mean(R~)`` (the consistency value), loss ``-A~ * log pi`` — the gradient of
    ``(1 / 2 beta) * sum_i (R~_i - mean R~)^2``. No importance weights; the ``advantages`` input is unused."""
    assert x.scores is not None and x.group_ids is not None
    if x.beta > 0 and x.ref_logprobs is None:
        raise ValueError("policy loss 'agro' with beta > 0 needs ref_logprobs=...")
    seq_kl = torch.zeros_like(x.scores, dtype=x.logprobs.dtype)
    if x.ref_logprobs is not None:
        seq_kl = sequence_sum(x.logprobs.detach() - x.ref_logprobs, x.response_mask)  # [B]
    reg = x.scores.to(x.logprobs.dtype) - x.beta * seq_kl  # [B]
    mean, _, n = group_stats(reg, x.group_ids)
    adv = torch.where(n > 1, reg - mean, torch.zeros_like(reg)).unsqueeze(-1)  # [B, 1]
    loss = -adv * _straight_through(x.logprobs)  # [B, T]
    has = x.response_mask.any(dim=-1)
    metrics = {
        "agro_consistency": masked_mean((adv.squeeze(-1) ** 2), has),
        "agro_seq_kl": masked_mean(seq_kl, has),
    }
    return loss, metrics


def _weight_metrics(w: torch.Tensor, mask: torch.Tensor, cap: float) -> dict[str, torch.Tensor]:
    m = mask.to(torch.bool)
    if not m.any():
        zero = w.new_zeros(())
        return {"behav_weight_mean": zero, "behav_weight_capped_frac": zero}
    return {
        "behav_weight_mean": masked_mean(w, m),
        "behav_weight_capped_frac": _frac(w >= cap, m),
    }
