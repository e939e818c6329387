"""The critic's update: ``ppo_epochs`` × mini-batches of the clipped value loss, each one step of the
critic's own AdamW accumulated over micro-batches (same batching as the policy update).

Micro-batch scaling: each micro loss is divided by the mini-batch's token count (``global_tokens``), so
accumulated gradients equal one backward over the whole mini-batch. Data parallelism (``sync``, a
:class:`~tandem.train.update.GradientSync`, as in the policy update) relies on the same property: each
rank back-propagates its rows of the global mini-batch and the gradients are summed over ranks before
clipping, so every replica takes the same critic step.

With ``critic.shared_backbone`` the value head sits on the policy: its parameters are a param group of the
policy optimiser (:func:`add_value_head_group`) and the value loss joins the policy's backward
(:class:`tandem.train.update.SharedValue`, :func:`shared_value`). :func:`critic_update` then serves only
the critic warm-up, where the head learns alone (the backbone runs without gradient).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch

from tandem.algos import value_loss
from tandem.config.schema import CriticConfig, TrainerConfig
from tandem.models.value import SharedValueHead
from tandem.train.update import GradientSync, SharedValue, autocast_context, filler_row, group_shuffle
from tandem.types import Experience


@dataclass(frozen=True)
class CriticSettings:
    """What the critic update needs from the config, resolved once."""

    ppo_epochs: int
    mini_batch_size: int | None
    micro_batch_size: int | None
    max_grad_norm: float | None
    value_clip: float | None
    vf_coef: float
    warmup_steps: int
    autocast_bf16: bool
    shared_backbone: bool = False

    @classmethod
    def from_config(
        cls, critic: CriticConfig, trainer: TrainerConfig, *, autocast_bf16: bool
    ) -> CriticSettings:
        return cls(
            ppo_epochs=trainer.ppo_epochs,
            mini_batch_size=trainer.mini_batch_size,
            micro_batch_size=trainer.micro_batch_size,
            max_grad_norm=trainer.max_grad_norm,
            value_clip=critic.value_clip,
            vf_coef=critic.vf_coef,
            warmup_steps=critic.warmup_steps,
            autocast_bf16=autocast_bf16,
            shared_backbone=critic.shared_backbone,
        )


def build_critic_optimizer(
    critic: torch.nn.Module, cfg: CriticConfig, trainer: TrainerConfig
) -> torch.optim.AdamW:
    """The critic's own AdamW (constant LR ``critic.lr``; betas and weight decay from the trainer)."""
    params = [p for p in critic.parameters() if p.requires_grad]
    return torch.optim.AdamW(params, lr=cfg.lr, betas=trainer.betas, weight_decay=trainer.weight_decay)


def add_value_head_group(
    optimizer: torch.optim.Optimizer, head: SharedValueHead, cfg: CriticConfig, trainer: TrainerConfig
) -> None:
    """Give a shared-backbone value head its own param group in the policy optimiser: ``lr=critic.lr``
    (then scaled by the trainer's LR schedule like every group) and the separate critic's weight decay.
    Call before the scheduler is built, so the scheduler knows the group."""
    params = [p for p in head.parameters() if p.requires_grad]
    optimizer.add_param_group({"params": params, "lr": cfg.lr, "weight_decay": trainer.weight_decay})


def shared_value(head: SharedValueHead, s: CriticSettings) -> SharedValue:
    """What the policy update needs to add the head's clipped value loss to its own backward."""
    if not isinstance(head, SharedValueHead):
        raise TypeError(f"critic.shared_backbone needs a SharedValueHead critic, got {type(head).__name__}")
    return SharedValue(head=head, vf_coef=s.vf_coef, value_clip=s.value_clip)


def critic_update(
    critic: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    exp: Experience,
    s: CriticSettings,
    *,
    generator: torch.Generator | None = None,
    sync: GradientSync | None = None,
) -> dict[str, float]:
    """Fit the critic to ``exp.returns`` (``exp.values`` are the rollout-time values the clip is
    measured from); returns averaged ``critic/vf_loss``, ``critic/vf_clipfrac`` and ``critic/grad_norm``.

    ``sync``: data-parallel ranks; ``exp`` is then the global batch on every rank (same ``generator``
    state everywhere), and the critic's gradients are reduced over ranks before clipping (the result
    equals one process training on ``exp``)."""
    if exp.values is None:
        raise ValueError("critic_update needs exp.values (old values from make_experience with a critic)")
    critic.train()
    B = exp.batch_size
    mini = s.mini_batch_size or B
    micro = s.micro_batch_size or mini
    sums: dict[str, float] = defaultdict(float)
    n_steps = 0
    for _ in range(s.ppo_epochs):
        order = group_shuffle(exp.rollout.group_ids, generator) if mini < B else torch.arange(B)
        for mini_idx in order.split(mini):
            for k, v in _critic_step(critic, optimizer, exp.select(mini_idx), micro, s, sync).items():
                sums[k] += v
            n_steps += 1
    return {k: v / max(1, n_steps) for k, v in sums.items()}


def _critic_step(
    critic: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    mb: Experience,
    micro: int,
    s: CriticSettings,
    sync: GradientSync | None = None,
) -> dict[str, float]:
    optimizer.zero_grad(set_to_none=True)
    n = mb.batch_size
    mini_tokens = max(1, int(mb.rollout.response_mask.sum()))  # global count, also under data parallelism
    out: dict[str, float] = defaultdict(float)
    rows = torch.arange(n) if sync is None else sync.local_rows(mb)
    chunks = rows.split(micro)
    fillers = 0 if sync is None else sync.filler_passes(len(chunks))  # agreed before any pass
    for micro_idx in chunks:
        m = mb.select(micro_idx) if len(micro_idx) < n else mb
        r = m.rollout
        with autocast_context(s.autocast_bf16):
            values = critic.values(r.prompt_ids, r.prompt_mask, r.response_ids, r.response_mask)  # [b, R]
        loss, clipfrac = value_loss(
            values.float(), m.values, m.returns, r.response_mask, clip=s.value_clip, global_tokens=mini_tokens
        )
        (s.vf_coef * loss).backward()
        tokens = int(r.response_mask.sum())
        out["critic/vf_loss"] += float(loss.detach())  # shares of the mini-batch loss add up to it
        out["critic/vf_clipfrac"] += clipfrac * tokens / mini_tokens
    for _ in range(fillers):  # passes that add nothing, so every rank runs as many
        r = mb.select(filler_row(rows)).rollout
        with autocast_context(s.autocast_bf16):
            values = critic.values(r.prompt_ids, r.prompt_mask, r.response_ids, r.response_mask)
        (values.float().sum() * 0.0).backward()
    if sync is not None:  # every trainable parameter joins the sum (zeros where this rank's rows missed it)
        out = defaultdict(float, sync.reduce([p for p in critic.parameters() if p.requires_grad], dict(out)))
    params = [p for p in critic.parameters() if p.grad is not None]
    if s.max_grad_norm is not None:
        grad_norm = torch.nn.utils.clip_grad_norm_(params, s.max_grad_norm)
    else:
        grad_norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params]))
    out["critic/grad_norm"] = float(grad_norm)
    if torch.isfinite(grad_norm):
        optimizer.step()
    else:
        out["critic/skipped_nonfinite"] = 1.0
    return dict(out)
