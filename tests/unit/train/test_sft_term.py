"""``algorithm.sft_coef``: an NLL term on the batch's successful samples, beside the policy loss."""

from __future__ import annotations

import math

import pytest
import torch
from grad_capture import capture_grads

from tandem.algos import success_nll, success_tokens
from tandem.config.schema import AlgorithmConfig, TrainerConfig
from tandem.models import load_causal_lm
from tandem.models.forward import response_logprobs
from tandem.train.optim import build_optimizer
from tandem.train.update import UpdateSettings, policy_update
from tandem.types import Experience, RolloutBatch


def test_success_nll_touches_only_successful_tokens():
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]], dtype=torch.bool)
    scores = torch.tensor([1.0, 0.0, 1.0, 0.5])
    logprobs = (-torch.rand(4, 3)).requires_grad_()
    loss, metrics = success_nll(logprobs, mask, scores, min_score=1.0)
    loss.backward()
    ok = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 0], [0, 0, 0]], dtype=torch.float)
    assert success_tokens(scores, mask, 1.0) == 3
    assert loss.item() == pytest.approx(-(logprobs.detach() * ok).sum().item() / 3)
    torch.testing.assert_close(logprobs.grad, -ok / 3)  # -1/count on successful tokens, 0 elsewhere
    assert metrics["sft_frac"].item() == pytest.approx(0.5)
    # a lower bar admits the 0.5 sample too
    assert success_tokens(scores, mask, 0.5) == 5


def test_success_nll_without_successes_is_zero_and_has_no_gradient():
    logprobs = (-torch.rand(2, 3)).requires_grad_()
    loss, metrics = success_nll(logprobs, torch.ones(2, 3, dtype=torch.bool), torch.zeros(2), 1.0)
    loss.backward()
    assert loss.item() == 0.0 and metrics["sft_frac"].item() == 0.0
    assert not logprobs.grad.any()


def _all_equal_experience(scores: list[float], P=3, R=4, seed=0) -> Experience:
    """Groups of 4 whose rewards are all equal inside each group: every GRPO advantage is 0."""
    B = len(scores)
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(B, R, dtype=torch.bool)
    rollout = RolloutBatch(
        prompt_ids=torch.randint(4, 40, (B, P), generator=g),
        prompt_mask=torch.ones(B, P, dtype=torch.bool),
        response_ids=torch.randint(4, 40, (B, R), generator=g),
        response_mask=mask,
        behavior_logprobs=-torch.rand(B, R, generator=g),
        group_ids=torch.arange(B) // 4,
        policy_version=torch.zeros(B, dtype=torch.long),
        prompts=["p"] * B,
        completions=["c"] * B,
        finish_reasons=["stop"] * B,
    )
    zeros = torch.zeros(B, R)
    return Experience(
        rollout=rollout, scores=torch.tensor(scores), old_logprobs=None, advantages=zeros, returns=zeros
    )


def _seq_logprob(model, exp: Experience) -> torch.Tensor:
    r = exp.rollout
    with torch.no_grad():
        lp, _ = response_logprobs(model, r.prompt_ids, r.prompt_mask, r.response_ids, r.response_mask)
    return (lp * r.response_mask).sum(dim=1)  # [B]


def _update(model_dir, exp, sft_coef, micro=None):
    model = load_causal_lm(model_dir)
    before = _seq_logprob(model, exp)
    algo = AlgorithmConfig(name="grpo", sft_coef=sft_coef)
    trainer = TrainerConfig(micro_batch_size=micro, max_grad_norm=None, lr=1e-2)
    settings = UpdateSettings.from_config(
        algo, trainer, temperature=1.0, autocast_bf16=False, max_new_tokens=4
    )
    opt = build_optimizer(model, trainer)
    grads = capture_grads(model, opt)
    metrics = policy_update(model, opt, None, exp, settings)
    return before, _seq_logprob(model, exp), grads, metrics


def test_the_term_learns_from_groups_the_policy_gradient_ignores(tiny_model_dir):
    """All groups all-equal (one all-solved, one all-failed): GRPO has nothing to learn; with sft_coef the
    solved group's completions become more likely."""
    exp = _all_equal_experience([1.0] * 4 + [0.0] * 4)
    _, _, grads_off, m_off = _update(tiny_model_dir, exp, 0.0)
    assert all(not g.any() for g in grads_off.values())
    assert "actor/sft_loss" not in m_off
    before, after, _, m_on = _update(tiny_model_dir, exp, 0.5)
    assert (after[:4] > before[:4]).all()
    assert m_on["actor/sft_frac"] == pytest.approx(0.5)
    assert m_on["actor/sft_loss"] == pytest.approx(-before[:4].sum().item() / 16, rel=1e-4)


def test_micro_batching_gives_the_full_batch_sft_gradient(tiny_model_dir):
    exp = _all_equal_experience([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0])
    _, _, full, m_full = _update(tiny_model_dir, exp, 0.3)
    _, _, micro, m_micro = _update(tiny_model_dir, exp, 0.3, micro=3)
    for name in full:
        torch.testing.assert_close(micro[name], full[name], rtol=1e-4, atol=1e-6)
    assert math.isclose(m_full["actor/sft_loss"], m_micro["actor/sft_loss"], rel_tol=1e-4)
    assert math.isclose(m_full["actor/sft_frac"], m_micro["actor/sft_frac"], rel_tol=1e-6)
