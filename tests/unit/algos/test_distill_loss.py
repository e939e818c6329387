"""Forward KL to a teacher's top-k logits (offline distillation): hand-computed values, the full-vocab
case equals torch's kl_div, temperature scaling, masking."""

from __future__ import annotations

import math

import pytest
import torch

from tandem.algos import topk_forward_kl


def test_hand_computed_two_token_teacher():
    # teacher keeps tokens 0 and 2 with equal logits -> p = (0.5, 0.5); student uniform over 4 tokens
    student = torch.zeros(1, 1, 4)
    values, indices = torch.tensor([[[1.0, 1.0]]]), torch.tensor([[[0, 2]]])
    kl = topk_forward_kl(student, values, indices, torch.tensor([[True]]))
    # sum_k 0.5 * (log 0.5 - log 0.25) = log 2
    assert kl.item() == pytest.approx(math.log(2.0), abs=1e-6)


def test_full_vocab_equals_kl_div_and_temperature_scales_by_tau_squared():
    torch.manual_seed(0)
    s, t = torch.randn(2, 3, 5), torch.randn(2, 3, 5)
    top = t.topk(5, dim=-1)
    mask = torch.ones(2, 3, dtype=torch.bool)
    for tau in (1.0, 2.0):
        ref = (
            torch.nn.functional.kl_div(
                torch.log_softmax(s / tau, -1), torch.softmax(t / tau, -1), reduction="none"
            ).sum(-1)
            * tau**2
        )
        torch.testing.assert_close(topk_forward_kl(s, top.values, top.indices, mask, tau), ref)


def test_masked_positions_are_zero_and_gradient_flows_to_the_student_only():
    s = torch.randn(1, 2, 4, requires_grad=True)
    values, indices = torch.randn(1, 2, 2), torch.tensor([[[0, 1], [2, 3]]])
    kl = topk_forward_kl(s, values, indices, torch.tensor([[True, False]]))
    assert kl[0, 1] == 0 and kl[0, 0] > 0
    kl.sum().backward()
    assert s.grad is not None and s.grad[0, 1].abs().sum() == 0


def test_student_equal_to_teacher_gives_zero():
    t = torch.randn(1, 2, 6)
    top = t.topk(6, dim=-1)
    kl = topk_forward_kl(t, top.values, top.indices, torch.ones(1, 2, dtype=torch.bool), 1.5)
    torch.testing.assert_close(kl, torch.zeros(1, 2), atol=1e-6, rtol=0)


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="temperature"):
        topk_forward_kl(
            torch.zeros(1, 1, 2), torch.zeros(1, 1, 1), torch.zeros(1, 1, 1), torch.ones(1, 1), 0.0
        )
    with pytest.raises(ValueError, match="do not match"):
        topk_forward_kl(torch.zeros(1, 1, 2), torch.zeros(1, 1, 2), torch.zeros(1, 1, 1), torch.ones(1, 1))
