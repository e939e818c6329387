"""Test helper: the gradients an optimiser step is about to apply (accumulated over micro-batches)."""

from __future__ import annotations

import torch


def capture_grads(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """Wrap ``opt.step`` so that each call first copies every parameter's ``.grad`` into the returned dict
    (name → tensor), right before the step applies it."""
    grads: dict[str, torch.Tensor] = {}
    original_step = opt.step

    def step_and_capture(*a, **k):
        grads.update({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        return original_step(*a, **k)

    opt.step = step_and_capture
    return grads
