"""The optimiser: weight-decay groups, and the fused AdamW kernel where it applies."""

from __future__ import annotations

import torch

from tandem.config.schema import TrainerConfig
from tandem.train.optim import build_optimizer, fusable


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.LayerNorm(5), torch.nn.Linear(5, 3))


def _train(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(4, 6, generator=g)
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()


def test_matrices_decay_and_vectors_do_not():
    cfg = TrainerConfig(weight_decay=0.1)
    opt = build_optimizer(_model(0), cfg)
    decay, no_decay = opt.param_groups
    assert [p.ndim for p in decay["params"]] == [2, 2] and decay["weight_decay"] == 0.1
    assert all(p.ndim == 1 for p in no_decay["params"]) and no_decay["weight_decay"] == 0.0


def test_plain_cpu_parameters_take_the_fused_kernel_with_the_same_update():
    cfg = TrainerConfig(weight_decay=0.1, lr=1e-2)
    fused_model, loop_model = _model(0), _model(0)
    opt = build_optimizer(fused_model, cfg)
    assert all(group["fused"] for group in opt.param_groups)
    reference = torch.optim.AdamW(
        [
            {"params": [p for p in loop_model.parameters() if p.ndim >= 2], "weight_decay": 0.1},
            {"params": [p for p in loop_model.parameters() if p.ndim < 2], "weight_decay": 0.0},
        ],
        lr=1e-2,
        betas=tuple(cfg.betas),
        foreach=False,
    )
    _train(fused_model, opt, 5)
    _train(loop_model, reference, 5)
    for a, b in zip(fused_model.parameters(), loop_model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        pairs = zip(fused_model.parameters(), _model(0).parameters(), strict=True)
        moved = sum(float((a - b).abs().sum()) for a, b in pairs)
    assert moved > 1e-3  # the five steps changed the weights


def test_parameters_the_fused_kernel_cannot_take_fall_back_to_foreach():
    plain = [torch.nn.Parameter(torch.zeros(2, 2))]
    assert fusable(plain)
    assert not fusable(plain + [torch.nn.Parameter(torch.zeros(2, device="meta"))])  # two devices
    assert not fusable([torch.nn.Parameter(torch.zeros(2, device="meta"))])  # not CPU or CUDA
    model = _model(0).to("meta")
    opt = build_optimizer(model, TrainerConfig())
    assert all(group["foreach"] and not group["fused"] for group in opt.param_groups)
