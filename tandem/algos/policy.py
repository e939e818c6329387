"""``policy_loss``: the one entry point the learner calls, whatever the configured algorithm.

It looks the loss up by name, applies the optional rollout correction, adds ``beta * KL(pi || pi_ref)``
per token (unless the loss owns its KL term), aggregates with the configured mode and returns detached
metrics. Order per token: ``w_correction * loss_t + beta * kl_t``, then ``aggregate``.
"""

from __future__ import annotations

from typing import Any

import torch

from tandem.algos.aggregation import aggregate
from tandem.algos.core import masked_mean
from tandem.algos.corrections import CORRECTIONS, correction_weights
from tandem.algos.kl import kl_penalty
from tandem.algos.policy_losses import POLICY_LOSSES, PolicyLossInputs, PolicyLossSpec
from tandem.algos.registry import PluginError, call_registered

_LOG_RATIO_LIMIT = 20.0


def policy_loss(
    name: str,
    *,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    options: object | None = None,
    behavior_logprobs: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    scores: torch.Tensor | None = None,
    group_ids: torch.Tensor | None = None,
    beta: float = 0.0,
    correction: str | None = None,
    correction_low: float | None = None,
    correction_high: float = 2.0,
    aggregation: str = "token-mean",
    global_tokens: float | None = None,
    global_seqs: float | None = None,
    norm_constant: float | None = None,
    kl_kind: str = "k3",
    **option_values: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Scalar loss to minimise and a dict of float metrics for the registered policy loss ``name``.

    Tensors are ``[B, T]`` (``scores``, ``group_ids``: ``[B]``); only ``logprobs`` carries gradient.
    ``options``: the loss's hyper-parameters, an instance of ``POLICY_LOSSES[name].options`` (defaults
    when None); keyword arguments not named here set fields of it, e.g. ``clip_high=0.28`` (a name the
    loss does not have is a ValueError listing its options).
    ``correction`` (a name in ``CORRECTIONS``: ``token_tis``, ``seq_tis``, ``token_mis``, ``seq_mis``,
    ``token_rs``, ``seq_rs``) reweights by ``pi_old / pi_behavior`` with bounds
    ``[correction_low (default 1/high), correction_high]``;
    ``decoupled_ppo`` uses ``correction_high`` as its behaviour-weight cap instead. ``global_tokens`` /
    ``global_seqs`` / ``norm_constant`` are passed to :func:`aggregate` (micro-batch invariance).
    Metrics: ``clipfrac_low``, ``clipfrac_high``, ``clipfrac``, ``approx_kl`` (k3 of old -> new),
    ``ratio_mean``, ``ratio_max``, ``pg_loss``, loss-specific keys, ``correction_weight_{mean,min,max}``
    and ``correction_masked_frac`` with a correction, ``kl_ref`` and ``kl_loss`` with ``ref_logprobs``.
    """
    spec = POLICY_LOSSES.get(name)
    mask = response_mask.to(torch.bool)
    _validate(
        name,
        spec,
        logprobs,
        old_logprobs,
        advantages,
        mask,
        behavior_logprobs,
        ref_logprobs,
        scores,
        group_ids,
    )
    if beta < 0:
        raise ValueError(f"beta must be >= 0, got {beta}")
    try:
        opts = spec.make_options(options, **option_values)
    except ValueError as exc:
        raise ValueError(f"policy loss {name!r}: {exc}") from None
    inp = PolicyLossInputs(
        logprobs=logprobs,
        old_logprobs=_clean(old_logprobs, mask),
        advantages=_clean(advantages, mask),
        response_mask=mask,
        options=opts,
        behavior_logprobs=None if behavior_logprobs is None else _clean(behavior_logprobs, mask),
        ref_logprobs=None if ref_logprobs is None else _clean(ref_logprobs, mask),
        scores=None if scores is None else scores.detach(),
        group_ids=group_ids,
        beta=beta,
        weight_cap=correction_high,
    )
    loss_mat, metrics = _checked_loss(
        name, call_registered("policy loss", name, spec.fn, inp), mask
    )  # [B, T]
    if correction is not None:
        loss_mat, corr_metrics = _apply_correction(name, spec, inp, loss_mat, correction, correction_low)
        metrics.update(corr_metrics)
    agg = {"global_tokens": global_tokens, "global_seqs": global_seqs, "norm_constant": norm_constant}
    pg_loss = aggregate(loss_mat, mask, aggregation, **agg)
    total = pg_loss
    if ref_logprobs is not None:
        kl = kl_penalty(logprobs, inp.ref_logprobs, kl_kind)  # [B, T]
        metrics["kl_ref"] = masked_mean(kl.detach(), mask)
        if beta > 0 and not spec.owns_kl:
            kl_loss = aggregate(kl, mask, aggregation, **agg)
            total = pg_loss + beta * kl_loss
            metrics["kl_loss"] = kl_loss.detach()
    elif beta > 0 and not spec.owns_kl:
        raise ValueError(f"policy loss {name!r} with beta={beta} > 0 needs ref_logprobs=... (or set beta: 0)")
    metrics["pg_loss"] = pg_loss.detach()
    metrics.update(_ratio_metrics(logprobs.detach(), inp.old_logprobs, mask))
    return total, _to_floats(metrics)


def _clean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Detached copy with padded positions set to 0, so garbage there cannot reach the gradient."""
    x = x.detach()
    return torch.where(mask, x, torch.zeros_like(x))


def _validate(
    name: str,
    spec: PolicyLossSpec,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    behavior_logprobs: torch.Tensor | None,
    ref_logprobs: torch.Tensor | None,
    scores: torch.Tensor | None,
    group_ids: torch.Tensor | None,
) -> None:
    shape = tuple(mask.shape)
    named = {"logprobs": logprobs, "old_logprobs": old_logprobs, "advantages": advantages}
    named.update({"behavior_logprobs": behavior_logprobs, "ref_logprobs": ref_logprobs})
    for key, t in named.items():
        if t is not None and tuple(t.shape) != shape:
            raise ValueError(f"policy loss {name!r}: {key} has shape {tuple(t.shape)}, expected {shape}")
    for key, t in {"scores": scores, "group_ids": group_ids}.items():
        if t is not None and tuple(t.shape) != shape[:1]:
            raise ValueError(f"policy loss {name!r}: {key} has shape {tuple(t.shape)}, expected {shape[:1]}")
    given = {"behavior_logprobs": behavior_logprobs, "ref_logprobs": ref_logprobs, "scores": scores}
    given["group_ids"] = group_ids
    for key in spec.requires:
        if given.get(key) is None:
            raise ValueError(f"policy loss {name!r} needs {key}=...; pass it or pick another loss")


def _checked_loss(name: str, out: object, mask: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """A loss's ``(loss [B, T], metrics dict)``, or a :class:`PluginError` saying what it returned instead
    (a ``[B]`` per-sequence loss would otherwise fail deep in the aggregation)."""
    ok = (
        isinstance(out, tuple)
        and len(out) == 2
        and isinstance(out[0], torch.Tensor)
        and isinstance(out[1], dict)
    )
    if not ok:
        got = type(out).__name__ if not isinstance(out, tuple) else f"a tuple of {len(out)}"
        raise PluginError(
            f"policy loss {name!r} returned {got}; it must return (loss [B, T], dict of scalar tensors)"
        )
    loss, metrics = out
    if tuple(loss.shape) != tuple(mask.shape):
        raise PluginError(
            f"policy loss {name!r} returned a loss of shape {list(loss.shape)}; it must be [B, T] = "
            f"{list(mask.shape)} (one value per response token)"
        )
    return loss, metrics


def _apply_correction(
    name: str,
    spec: PolicyLossSpec,
    inp: PolicyLossInputs,
    loss_mat: torch.Tensor,
    correction: str,
    correction_low: float | None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    CORRECTIONS.get(correction)  # unknown names fail before other checks
    if spec.owns_behavior_correction:
        raise ValueError(
            f"policy loss {name!r} already corrects for the behaviour policy; set correction: null"
        )
    if inp.behavior_logprobs is None:
        raise ValueError(
            f"correction {correction!r} needs behavior_logprobs=... (log-probs from the sampler)"
        )
    w = correction_weights(
        correction, inp.old_logprobs, inp.behavior_logprobs, inp.response_mask, correction_low, inp.weight_cap
    )  # [B, T]
    m = inp.response_mask
    if m.any():
        stats = {
            "correction_weight_mean": masked_mean(w, m),
            "correction_weight_min": w[m].min(),
            "correction_weight_max": w[m].max(),
            "correction_masked_frac": masked_mean((w == 0).float(), m),
        }
    else:
        stats = {k: w.new_zeros(()) for k in ("correction_weight_mean", "correction_weight_min")}
        stats.update({k: w.new_zeros(()) for k in ("correction_weight_max", "correction_masked_frac")})
    return w * loss_mat, stats


def _ratio_metrics(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Diagnostics of the current policy against the proximal one (``r = pi / pi_old`` per token)."""
    log_r = (logprobs - old_logprobs).clamp(-_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT)
    ratio = torch.exp(log_r)
    approx_kl = ratio - 1.0 - log_r  # k3 estimate of KL(pi_old || pi) on samples from pi_old, >= 0
    ratio_max = (
        torch.where(mask, ratio, torch.zeros_like(ratio)).max() if mask.numel() else ratio.new_zeros(())
    )
    return {
        "approx_kl": masked_mean(approx_kl, mask),
        "ratio_mean": masked_mean(ratio, mask),
        "ratio_max": ratio_max,
    }


def _to_floats(metrics: dict[str, torch.Tensor]) -> dict[str, float]:
    """One device sync for all metrics."""
    keys = list(metrics)
    values = torch.stack([metrics[k].detach().float().reshape(()) for k in keys]).tolist() if keys else []
    return dict(zip(keys, values, strict=True))
