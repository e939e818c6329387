"""Optimiser and learning-rate schedule: AdamW with linear warmup then cosine (or constant)."""

from __future__ import annotations

import math

import torch

from tandem.config.schema import TrainerConfig


def fusable(params: list[torch.Tensor]) -> bool:
    """Whether torch's fused AdamW kernel takes these parameters: plain (not sharded DTensor) floating
    tensors, all on one CPU or CUDA device."""
    devices = {p.device for p in params}
    return (
        len(devices) == 1
        and next(iter(devices)).type in ("cpu", "cuda")
        and all(type(p.data) is torch.Tensor and p.dtype.is_floating_point for p in params)
    )


def build_optimizer(model: torch.nn.Module, cfg: TrainerConfig) -> torch.optim.AdamW:
    """AdamW over trainable parameters; no weight decay on biases and norm weights (1-D tensors).

    The fused kernel (one pass over every parameter's moments) where it applies: the same update as the
    per-tensor loop to float rounding, and on a 1M-parameter model 1.0 ms a step against 3.2 ms
    (docs/benchmarks.md); else the multi-tensor (foreach) implementation, e.g. for FSDP2's sharded
    parameters."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    kernel = {"fused": True} if fusable(decay + no_decay) else {"foreach": True}
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), **kernel)


def lr_factor(step: int, *, warmup: int, total: int, schedule: str, min_ratio: float) -> float:
    """Multiplier of the peak LR at optimiser step ``step`` (0-based)."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant" or total <= warmup:
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(
    optimizer: torch.optim.Optimizer, cfg: TrainerConfig, total_optimizer_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """LambdaLR applying :func:`lr_factor`; its state (last step) is checkpointed with the optimiser."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: lr_factor(
            s,
            warmup=cfg.warmup_steps,
            total=total_optimizer_steps,
            schedule=cfg.lr_schedule,
            min_ratio=cfg.min_lr_ratio,
        ),
    )
