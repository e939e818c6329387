"""The learner's policy update: ``ppo_epochs`` × mini-batches, each one optimiser step accumulated over
micro-batches. The loss comes from the algorithm library by name; this module never branches on it.

Metric aggregation: metrics are share-weighted means over micro-batches (summed over data-parallel ranks)
and plain means over optimiser steps, except names ending in ``_max`` / ``_min`` (``actor/ratio_max``,
``rollout/logprob_diff_max``, ...), which keep the extreme everywhere: a mean of per-micro-batch maxima
would depend on the micro-batch size and hide one bad micro-batch (:func:`metric_reduction`).

Micro-batch scaling: every micro loss is the micro-batch's share of the mini-batch loss, so accumulated
gradients equal one backward over the whole mini-batch: the aggregation divides by the mini-batch's
token and sequence counts (``global_tokens`` / ``global_seqs``), whatever the mode. Data parallelism
(a :class:`GradientSync`) relies on the same property: each rank back-propagates its rows of the
mini-batch and the gradients are summed over ranks before clipping.
"""

from __future__ import annotations

import contextlib
import warnings
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from tandem.algos import (
    POLICY_LOSSES,
    PluginError,
    aggregate,
    high_entropy_mask,
    logprob_mismatch,
    policy_loss,
    reference_nll,
    success_nll,
    success_tokens,
    value_loss,
    zero_advantage_groups,
)
from tandem.config.schema import AlgorithmConfig, TrainerConfig
from tandem.errors import ConfigError, ModelError
from tandem.models.forward import distinct_rows, prompt_runs, response_logprobs
from tandem.models.packing import row_lengths, token_budget_chunks
from tandem.models.value import SharedValueHead, ValueCapture
from tandem.types import Experience, RolloutBatch


@dataclass(frozen=True)
class UpdateSettings:
    """Everything the update needs from the config, resolved once."""

    ppo_epochs: int
    mini_batch_size: int | None
    micro_batch_size: int | None
    max_grad_norm: float | None
    entropy_coef: float
    temperature: float
    autocast_bf16: bool
    loss_name: str
    loss_options: Any  # the loss's options dataclass (``POLICY_LOSSES[loss_name].options``), or None
    aggregation: str
    norm_constant: float  # seq-mean-token-sum-norm's divisor: rollout.max_new_tokens
    beta: float  # β of the KL term in the loss (0 when the KL goes into the reward)
    kl_kind: str
    correction: str | None
    correction_low: float | None
    correction_high: float
    share_prefix: bool = False  # rows of a group share a prompt: score each run of one prompt once
    dedupe: bool = False  # identical rows run through the model once (response_logprobs ``dedupe``)
    micro_batch_tokens: int | None = (
        None  # token-budget micro-batches, run packed (replaces micro_batch_size)
    )
    whole_groups: bool = False  # the loss needs every row of a group in one micro-batch
    gradient_checkpointing: bool = False
    sft_coef: float = 0.0  # auxiliary NLL on successful samples (tandem.algos.imitation); 0 = off
    sft_min_score: float = 1.0
    reference_coef: float = 0.0  # NLL on rollout.reference_answers rows (mode=imitate); 0 = off
    skip_zero_advantage: bool = False  # leave zero-advantage groups out (resolved: only where exact)
    top_entropy_quantile: float = 1.0  # policy gradient only on this top fraction of tokens by entropy

    @classmethod
    def from_config(
        cls,
        algo: AlgorithmConfig,
        trainer: TrainerConfig,
        *,
        temperature: float,
        autocast_bf16: bool,
        max_new_tokens: int,
        share_prefix: bool = False,
        reference_coef: float = 0.0,
        dedupe: bool = False,
    ) -> UpdateSettings:
        assert algo.policy_loss is not None and algo.aggregation is not None  # the config checks ensure it
        return cls(
            ppo_epochs=trainer.ppo_epochs,
            mini_batch_size=trainer.mini_batch_size,
            micro_batch_size=trainer.micro_batch_size,
            max_grad_norm=trainer.max_grad_norm,
            entropy_coef=algo.entropy_coef,
            temperature=max(temperature, 1e-6) if temperature > 0 else 1.0,
            autocast_bf16=autocast_bf16,
            loss_name=algo.policy_loss,
            loss_options=POLICY_LOSSES.get(algo.policy_loss).make_options(**algo.loss_options),
            aggregation=algo.aggregation,
            norm_constant=float(max_new_tokens),
            beta=algo.beta if algo.kl.where == "loss" else 0.0,
            kl_kind=algo.kl.kind,
            correction=algo.correction,
            correction_low=algo.correction_low,
            correction_high=algo.correction_high,
            # the shared-prefix KV cache is dropped by checkpointed layers, and packing replaces it
            share_prefix=share_prefix
            and not trainer.gradient_checkpointing
            and not trainer.micro_batch_tokens,
            dedupe=dedupe,
            micro_batch_tokens=trainer.micro_batch_tokens,
            whole_groups=POLICY_LOSSES.get(algo.policy_loss).needs_whole_groups,
            gradient_checkpointing=trainer.gradient_checkpointing,
            sft_coef=algo.sft_coef,
            sft_min_score=algo.sft_min_score,
            reference_coef=reference_coef,
            skip_zero_advantage=trainer.skip_zero_advantage
            and POLICY_LOSSES.get(algo.policy_loss).inert_at_zero_advantage
            and not (algo.beta > 0 and algo.kl.where == "loss")
            and algo.entropy_coef == 0
            and algo.entropy_target is None
            and algo.sft_coef == 0
            and reference_coef == 0,  # the reference rows sit in zero-advantage groups
            top_entropy_quantile=algo.top_entropy_quantile,
        )

    @property
    def on_policy_single_pass(self) -> bool:
        """One epoch over one mini-batch: the first (and only) forward *is* the old policy, so the separate
        old-log-prob pass can be skipped (ratio = 1 exactly)."""
        return self.ppo_epochs == 1 and self.mini_batch_size is None


@dataclass(frozen=True)
class SharedValue:
    """``critic.shared_backbone``: a value head on the policy trained in the policy's own backward — each
    micro-batch's loss is ``policy loss + vf_coef * clipped value loss`` from one forward, and the head's
    parameters (their own param group of the policy optimiser) are stepped and clipped with the policy's."""

    head: SharedValueHead
    vf_coef: float
    value_clip: float | None


class GradientSync(Protocol):
    """How a data-parallel learner joins the update (``tandem.train.distributed.DataParallel``)."""

    def local_rows(self, mb: Experience) -> torch.Tensor:
        """Rows of the (global) mini-batch this process back-propagates. ``[b]`` long."""
        ...

    def reduce(self, params: list[torch.nn.Parameter], metrics: dict[str, float]) -> dict[str, float]:
        """Sum gradients (in place) and the share-weighted metric sums over processes (``*_max`` /
        ``*_min`` metrics: the extreme, see :func:`metric_reduction`)."""
        ...

    def agree(self, veto: bool) -> bool:
        """One process's skip decision for all, so every replica steps or none does."""
        ...

    def filler_passes(self, passes: int) -> int:
        """How many passes that add nothing this process runs after its ``passes`` forward/backward passes
        of a mini-batch, so that every process runs as many (FSDP2: each pass is a collective)."""
        ...


def autocast_context(enabled: bool):
    """bf16 autocast on CPU when enabled, otherwise a no-op context."""
    return torch.autocast("cpu", dtype=torch.bfloat16) if enabled else contextlib.nullcontext()


def policy_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    exp: Experience,
    settings: UpdateSettings,
    *,
    generator: torch.Generator | None = None,
    on_optimizer_step: Callable[[], None] | None = None,
    pre_step: Callable[[dict[str, float]], bool] | None = None,
    sync: GradientSync | None = None,
    value: SharedValue | None = None,
) -> dict[str, float]:
    """Run the PPO-style update on one experience batch; returns averaged ``actor/*`` metrics (and
    ``critic/vf_loss``, ``critic/vf_clipfrac`` with a shared-backbone ``value`` head).

    ``pre_step(metrics)`` sees each mini-batch's loss and grad-norm metrics before ``optimizer.step()``;
    returning False drops that update (alert action ``skip``; counted in ``actor/skipped_by_alert``).
    ``sync``: data-parallel ranks; ``exp`` is then the global batch on every rank, and the gradients are
    reduced over ranks before clipping (the result equals one process training on ``exp``)."""
    model.train()
    if settings.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    B = exp.batch_size
    mini = settings.mini_batch_size or B
    micro = settings.micro_batch_size or mini
    sums: dict[str, float] = {}
    counts: dict[str, int] = defaultdict(int)
    for _ in range(settings.ppo_epochs):
        order = group_shuffle(exp.rollout.group_ids, generator) if mini < B else torch.arange(B)
        for mini_idx in order.split(mini):
            mb = exp.select(mini_idx)
            metrics = _optimizer_step(model, optimizer, mb, micro, settings, pre_step, sync, value)
            if scheduler is not None:
                skipped = metrics.get("actor/skipped_by_alert") or metrics.get("actor/skipped_nonfinite")
                advance_schedule(scheduler, skipped=bool(skipped))
            if on_optimizer_step is not None:
                on_optimizer_step()
            for k, v in metrics.items():
                accumulate_metric(sums, k, v, 1.0)
                counts[k] += 1
    out = {k: v if metric_reduction(k) != "sum" else v / counts[k] for k, v in sums.items()}
    out["actor/lr"] = optimizer.param_groups[0]["lr"]
    return out


def enable_gradient_checkpointing(model: torch.nn.Module) -> None:
    """Hugging Face gradient checkpointing on ``model``, non-reentrant (works with frozen embeddings, as
    under LoRA, and with autocast); a no-op if already on. It acts in training mode only, so the no-grad
    scoring passes (eval mode) run as before."""
    if getattr(model, "is_gradient_checkpointing", False):
        return
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise ModelError(
            f"{type(model).__name__} does not support gradient checkpointing",
            where="trainer.gradient_checkpointing",
        )
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def micro_batches(mb: Experience, rows: torch.Tensor, micro: int, s: UpdateSettings) -> list[torch.Tensor]:
    """This process's ``rows`` of the mini-batch split into micro-batches: ``micro`` rows each, or, with
    ``micro_batch_tokens``, groups of rows whose real tokens fit the budget (whole groups when the loss
    needs them). Any partition gives the same accumulated gradient. ``rows`` ``[b]`` -> list of ``[b_i]``."""
    if s.micro_batch_tokens is None:
        return list(rows.split(micro))
    r = mb.rollout
    lengths = row_lengths(r.prompt_mask[rows], r.response_mask[rows]).cpu()  # [b]
    groups = r.group_ids[rows].cpu() if s.whole_groups else None
    return [rows[c.to(rows.device)] for c in token_budget_chunks(lengths, s.micro_batch_tokens, groups)]


_FIRST_STEP_SKIPPED = r"Detected call of `lr_scheduler\.step\(\)` before `optimizer\.step\(\)`"


def advance_schedule(scheduler: torch.optim.lr_scheduler.LRScheduler, *, skipped: bool) -> None:
    """Advance the LR schedule by one update slot, whether the slot's optimiser step ran or was dropped.

    The schedule counts update slots (``total_steps × ppo_epochs × mini-batches``), not applied updates: an
    update dropped by a ``skip`` alert or a non-finite gradient still uses its slot, so warm-up and decay
    end where the config says, a checkpoint's scheduler position is the number of slots consumed, and a
    rollback replays the same learning rates. When the dropped update is the run's first, PyTorch warns
    "Detected call of `lr_scheduler.step()` before `optimizer.step()` ... skipping the first value of the
    learning rate schedule" — which is exactly what the skip means here (the vetoed slot's LR is never
    used), not an ordering bug: every applied update still runs ``optimizer.step()`` first. So that one
    warning is silenced, for this call only and only when the step was dropped.
    """
    if not skipped:
        scheduler.step()
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_FIRST_STEP_SKIPPED, category=UserWarning)
        scheduler.step()


def metric_reduction(key: str) -> str:
    """How a metric combines over micro-batches, ranks and optimiser steps: ``"max"`` for names ending in
    ``_max``, ``"min"`` for ``_min``, otherwise ``"sum"`` (of share-weighted values, i.e. a mean)."""
    if key.endswith("_max"):
        return "max"
    if key.endswith("_min"):
        return "min"
    return "sum"


def accumulate_metric(acc: dict[str, float], key: str, value: float, weight: float) -> None:
    """Fold ``value`` into ``acc[key]``: the running extreme for ``*_max`` / ``*_min`` keys, else
    ``acc[key] + weight * value``."""
    how = metric_reduction(key)
    if key not in acc:
        acc[key] = value if how != "sum" else weight * value
    elif how == "max":
        acc[key] = max(acc[key], value)
    elif how == "min":
        acc[key] = min(acc[key], value)
    else:
        acc[key] += weight * value


def group_shuffle(group_ids: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """A random row order that shuffles whole groups and keeps each group's rows together, so mini- and
    micro-batches whose size is a multiple of the group size never split a group (losses such as AGRO
    need every sample of a prompt in one batch). group_ids ``[B]`` -> permutation ``[B]``."""
    uniq, inverse = torch.unique(group_ids, return_inverse=True)
    perm = torch.randperm(uniq.numel(), generator=generator)
    rank = torch.empty_like(perm)
    rank[perm] = torch.arange(perm.numel())
    # Stable sort by the group's shuffled rank keeps rows of a group in their original order.
    return torch.sort(rank[inverse], stable=True).indices


def _optimizer_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    mb: Experience,
    micro: int,
    s: UpdateSettings,
    pre_step: Callable[[dict[str, float]], bool] | None = None,
    sync: GradientSync | None = None,
    value: SharedValue | None = None,
) -> dict[str, float]:
    optimizer.zero_grad(set_to_none=True)
    n = mb.batch_size
    mini_tokens = max(1, int(mb.rollout.response_mask.sum()))  # global counts, also under data parallelism
    mini_seqs = max(1, int(mb.rollout.response_mask.any(dim=1).sum()))
    # the SFT term's normaliser: successful tokens of the whole mini-batch (0 when the term is off)
    mini_success = success_tokens(mb.scores, mb.rollout.response_mask, s.sft_min_score) if s.sft_coef else 0
    mini_reference = _reference_tokens(mb.rollout) if s.reference_coef else 0
    sums: dict[str, float] = defaultdict(float)
    rows = torch.arange(n) if sync is None else sync.local_rows(mb)
    rows, trained_tokens = _rows_to_train(mb, rows, s, sync is None and value is None)
    trained = len(rows) if sync is None else n  # the rows whose metrics are averaged (share denominator)
    chunks = micro_batches(mb, rows, micro, s)
    # passes that add nothing, after this rank's own (agreed before any pass: a collective itself)
    fillers = 0 if sync is None else sync.filler_passes(len(chunks))
    for micro_idx in chunks:
        m = mb.select(micro_idx) if len(micro_idx) < n else mb
        share = len(micro_idx) / trained
        metrics = _micro_backward(
            model, m, mini_tokens, mini_seqs, share, s, value, mini_success, trained_tokens, mini_reference
        )
        for k, v in metrics.items():
            accumulate_metric(sums, k, v, share)
    for _ in range(fillers):
        _filler_backward(model, mb.select(filler_row(rows)), s)
    if s.skip_zero_advantage:
        sums["actor/trained_frac"] = trained / n
    params = [p for p in model.parameters() if p.requires_grad]
    if value is not None:
        params += [p for p in value.head.parameters() if p.requires_grad]
    if sync is not None:
        sums = defaultdict(float, sync.reduce(params, dict(sums)))
    if s.max_grad_norm is not None:
        grad_norm = torch.nn.utils.clip_grad_norm_(params, s.max_grad_norm)
    else:
        grad_norm = torch.linalg.vector_norm(
            torch.stack([p.grad.norm() for p in params if p.grad is not None])
        )
    sums["actor/grad_norm"] = float(grad_norm)
    veto = pre_step is not None and not pre_step(dict(sums))
    if sync is not None:
        veto = sync.agree(veto)
    if veto:
        optimizer.zero_grad(set_to_none=True)
        sums["actor/skipped_by_alert"] = 1.0
    elif torch.isfinite(grad_norm):
        optimizer.step()
    else:
        sums["actor/skipped_nonfinite"] = 1.0
    return dict(sums)


def filler_row(rows: torch.Tensor) -> torch.Tensor:
    """The row a pass that adds nothing runs on: the first of this rank's ``rows``, or row 0 of the
    mini-batch if it has none. ``[1]`` long."""
    return rows[:1] if len(rows) else torch.zeros(1, dtype=torch.long)


def _filler_backward(model: torch.nn.Module, m: Experience, s: UpdateSettings) -> None:
    """A pass that adds nothing: ``m``'s forward (one row) and a backward of its log-probs times 0, so
    this rank joins the collectives of a pass that another rank runs on its larger share (FSDP2: every
    forward all-gathers, every backward reduce-scatters). The gradient it adds is exactly 0."""
    r = m.rollout
    with autocast_context(s.autocast_bf16):
        logprobs, _ = response_logprobs(
            model,
            r.prompt_ids,
            r.prompt_mask,
            r.response_ids,
            r.response_mask,
            temperature=s.temperature,
            share_prefix=s.share_prefix,
            packed=s.micro_batch_tokens is not None,
        )
    (logprobs.float().sum() * 0.0).backward()


def _reference_tokens(r: RolloutBatch) -> int:
    """Tokens of the reference rows (``rollout.reference_answers``) in ``r``: the NLL term's normaliser."""
    if r.reference is None:
        return 0
    return int((r.response_mask & r.reference.unsqueeze(1)).sum())


def _rows_to_train(
    mb: Experience, rows: torch.Tensor, s: UpdateSettings, allowed: bool
) -> tuple[torch.Tensor, int | None]:
    """``rows`` without the groups whose advantages are all 0 when skipping them changes nothing
    (``s.skip_zero_advantage``, a single process, no shared value head): they add 0 to the loss and its
    gradient, and the normalisers still count them. Returns the rows and their valid-token count (None when
    nothing was left out). If every group is inert all rows run, so the optimiser step is the usual one on
    a zero gradient (AdamW's moments still move). rows ``[b]`` -> ``[b']``."""
    if not (s.skip_zero_advantage and allowed):
        return rows, None
    r = mb.rollout
    keep = ~zero_advantage_groups(mb.advantages, r.response_mask, r.group_ids)  # [B]
    if bool(keep.all()) or not bool(keep.any()):
        return rows, None
    kept = rows[keep[rows]]
    return kept, max(1, int(r.response_mask[kept].sum()))


def _micro_backward(
    model: torch.nn.Module,
    m: Experience,
    mini_tokens: int,
    mini_seqs: int,
    share: float,
    s: UpdateSettings,
    value: SharedValue | None = None,
    mini_success: int = 0,
    metric_tokens: int | None = None,
    mini_reference: int = 0,
) -> dict[str, float]:
    """One micro-batch's forward and backward (its loss is its part of the mini-batch loss, normalised by
    ``mini_tokens`` / ``mini_seqs``); ``metric_tokens``: the valid tokens of the rows trained on, which
    token-mean metrics are averaged over (default ``mini_tokens``)."""
    r = m.rollout
    mask = r.response_mask
    capture = value.head.capture() if value is not None else contextlib.nullcontext()
    with autocast_context(s.autocast_bf16), capture as cap:
        logprobs, entropy = response_logprobs(
            model,
            r.prompt_ids,
            r.prompt_mask,
            r.response_ids,
            mask,
            temperature=s.temperature,
            with_entropy=True,
            share_prefix=s.share_prefix,
            # a shared value head reads the padded hidden states of every row, so its forward keeps them all
            packed=s.micro_batch_tokens is not None and value is None,
            dedupe=s.dedupe and value is None,
        )
    logprobs = logprobs.float()
    old = m.old_logprobs if m.old_logprobs is not None else logprobs.detach()
    advantages, kept = m.advantages, {}
    if s.top_entropy_quantile < 1:  # the policy gradient on the uncertain tokens only
        forking = high_entropy_mask(entropy.detach().float(), mask, s.top_entropy_quantile)  # [b, R]
        advantages = advantages * forking
        kept = {"actor/entropy_kept_frac": float(forking.sum()) / max(1, int(mask.sum()))}
    try:
        loss, metrics = policy_loss(
            s.loss_name,
            logprobs=logprobs,
            old_logprobs=old,
            advantages=advantages,
            response_mask=mask,
            behavior_logprobs=r.behavior_logprobs,
            ref_logprobs=m.ref_logprobs,
            scores=m.scores,
            group_ids=r.group_ids,
            global_tokens=mini_tokens,
            global_seqs=mini_seqs,
            options=s.loss_options,
            beta=s.beta,
            correction=s.correction,
            correction_low=s.correction_low,
            correction_high=s.correction_high,
            aggregation=s.aggregation,
            kl_kind=s.kl_kind,
            norm_constant=s.norm_constant,
        )
    except PluginError as exc:  # a run.plugins loss raised: one line naming it and its line
        raise ConfigError(str(exc), where="algorithm.policy_loss") from None
    if s.entropy_coef:
        ent = aggregate(
            entropy.float(),
            mask,
            s.aggregation,
            mini_tokens,
            global_seqs=mini_seqs,
            norm_constant=s.norm_constant,
        )
        loss = loss - s.entropy_coef * ent
    sft: dict[str, float] = {}
    if s.sft_coef:
        nll, sft_metrics = success_nll(logprobs, mask, m.scores, s.sft_min_score, max(mini_success, 1))
        loss = loss + s.sft_coef * nll
        sft = {
            "actor/sft_loss": float(nll.detach()) / share,
            "actor/sft_frac": float(sft_metrics["sft_frac"]),
        }
    if s.reference_coef and r.reference is not None:
        ref_nll = reference_nll(logprobs, mask, r.reference, mini_reference)
        loss = loss + s.reference_coef * ref_nll
        sft["actor/reference_nll"] = float(ref_nll.detach()) / share
    vf, vf_term = _shared_value_loss(value, cap, m, mini_tokens, share) if value is not None else ({}, 0.0)
    (loss + vf_term).backward()  # actor/loss below stays the policy's part; the value part is critic/vf_loss
    # Metrics are averaged over micro-batches weighted by ``share``; losses are shares of the mini-batch
    # loss, so divide them back to per-micro-batch values first.
    out = {f"actor/{k}": float(v) for k, v in metrics.items()}
    out["actor/pg_loss"] = float(metrics["pg_loss"]) / share
    out["actor/loss"] = float(loss.detach()) / share
    out["actor/entropy"] = float((entropy.detach() * mask).sum() / mask.sum().clamp(min=1))
    if s.dedupe and value is None:  # the share of rows the forward ran (the others were copies)
        found = distinct_rows(r.prompt_ids, r.prompt_mask, r.response_ids, mask)
        out["actor/distinct_frac"] = (len(found[0]) if found is not None else r.batch_size) / r.batch_size
    out.update(sft)
    out.update(kept)
    if m.old_logprobs is None:  # this forward is the policy before the update: the engine's yardstick
        tokens = metric_tokens or mini_tokens
        out.update(_mismatch_shares(logprobs.detach(), r.behavior_logprobs, mask, tokens, share))
    out.update(vf)
    return out


def _mismatch_shares(
    logprobs: torch.Tensor, behavior: torch.Tensor, mask: torch.Tensor, mini_tokens: int, share: float
) -> dict[str, float]:
    """``rollout/*`` mismatch metrics of one micro-batch, scaled so that their share-weighted sum over the
    micro-batches (and ranks) is the token mean over the mini-batch, like ``critic/vf_clipfrac``; the
    ``_max`` entry is kept as is (aggregated as a max). All tensors ``[b, R]``."""
    tokens = int(mask.sum())
    out = {}
    for k, v in logprob_mismatch(logprobs, behavior, mask).items():
        out[f"rollout/{k}"] = v if metric_reduction(k) == "max" else v * tokens / mini_tokens / share
    return out


def _shared_value_loss(
    value: SharedValue, cap: ValueCapture, m: Experience, mini_tokens: int, share: float
) -> tuple[dict[str, float], torch.Tensor]:
    """``vf_coef *`` the clipped value loss of the values captured in the policy forward, and its metrics
    (shares of the mini-batch loss divided back like ``pg_loss``; clipfrac weighted by tokens)."""
    if m.values is None:
        raise ValueError("a shared value head needs exp.values (make_experience with critic=the head)")
    mask = m.rollout.response_mask
    vloss, clipfrac = value_loss(
        cap.values(mask, prompt_runs(m.rollout.prompt_ids, m.rollout.prompt_mask)),
        m.values,
        m.returns,
        mask,
        clip=value.value_clip,
        global_tokens=mini_tokens,
    )
    metrics = {
        "critic/vf_loss": float(vloss.detach()) / share,
        "critic/vf_clipfrac": clipfrac * int(mask.sum()) / mini_tokens / share,
    }
    return metrics, value.vf_coef * vloss
