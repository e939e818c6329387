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


def update_grads(model_dir, exp, algo, **trainer_kw) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """The gradients and metrics of one ``policy_update`` of a fresh copy of the model in ``model_dir`` on
    ``exp`` with ``algo`` (an AlgorithmConfig), no clipping, lr 1e-3 plus ``trainer_kw``, seeded order."""
    from tandem.config.schema import TrainerConfig
    from tandem.models import load_causal_lm
    from tandem.train.optim import build_optimizer
    from tandem.train.update import UpdateSettings, policy_update

    model = load_causal_lm(model_dir)
    trainer = TrainerConfig(**{"max_grad_norm": None, "lr": 1e-3, **trainer_kw})
    settings = UpdateSettings.from_config(
        algo, trainer, temperature=1.0, autocast_bf16=False, max_new_tokens=5
    )
    opt = build_optimizer(model, trainer)
    grads = capture_grads(model, opt)
    metrics = policy_update(model, opt, None, exp, settings, generator=torch.Generator().manual_seed(0))
    return grads, metrics
