from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from tandem.algos import PREFERENCE_LOSSES, dpo_loss, explained_variance, reward_model_loss, value_loss

PC, PR = torch.tensor([-10.0, -4.0]), torch.tensor([-12.0, -3.0])
RC, RR = torch.tensor([-11.0, -4.0]), torch.tensor([-11.0, -4.0])
H = (PC - RC) - (PR - RR)  # [2, -1]


@pytest.mark.parametrize(
    ("loss_type", "eps", "expected"),
    [
        ("sigmoid", 0.0, -F.logsigmoid(0.1 * H)),
        ("sigmoid", 0.2, -0.8 * F.logsigmoid(0.1 * H) - 0.2 * F.logsigmoid(-0.1 * H)),
        ("ipo", 0.0, (H - 5.0) ** 2),
        ("hinge", 0.0, torch.relu(1 - 0.1 * H)),
        ("robust", 0.2, (-0.8 * F.logsigmoid(0.1 * H) + 0.2 * F.logsigmoid(-0.1 * H)) / 0.6),
    ],
)
def test_dpo_variants_hand_computed(loss_type: str, eps: float, expected: torch.Tensor) -> None:
    losses, cr, rr = dpo_loss(PC, PR, RC, RR, beta=0.1, loss_type=loss_type, label_smoothing=eps)
    torch.testing.assert_close(losses, expected)
    torch.testing.assert_close(cr, torch.tensor([0.1, 0.0]))
    torch.testing.assert_close(rr, torch.tensor([-0.1, 0.1]))


@given(st.lists(st.floats(-100, 0), min_size=2, max_size=2), st.floats(0.01, 2.0))
def test_dpo_is_log2_when_policy_equals_reference(lps: list[float], beta: float) -> None:
    c, r = torch.tensor(lps[:1]), torch.tensor(lps[1:])
    losses, cr, rr = dpo_loss(c, r, c.clone(), r.clone(), beta=beta)
    assert losses.item() == pytest.approx(math.log(2.0), rel=1e-6)
    assert cr.item() == 0.0 and rr.item() == 0.0


def test_dpo_gradient_raises_chosen_lowers_rejected() -> None:
    pc, pr = PC.clone().requires_grad_(True), PR.clone().requires_grad_(True)
    losses, _, _ = dpo_loss(pc, pr, RC, RR)
    losses.sum().backward()
    assert (pc.grad < 0).all() and (pr.grad > 0).all()


def test_dpo_lengths_normalise_the_margin_not_the_rewards() -> None:
    """``lengths`` divides each log-ratio by its completion's token count (TRL's ipo / sigmoid_norm)."""
    lengths = (torch.tensor([4.0, 2.0]), torch.tensor([1.0, 5.0]))
    h_norm = (PC - RC) / lengths[0] - (PR - RR) / lengths[1]  # [1/4 + 1, 0 - 1/5]
    losses, cr, rr = dpo_loss(PC, PR, RC, RR, beta=0.1, loss_type="ipo", lengths=lengths)
    torch.testing.assert_close(losses, (h_norm - 5.0) ** 2)
    torch.testing.assert_close(cr, torch.tensor([0.1, 0.0]))  # rewards stay summed
    losses, _, _ = dpo_loss(PC, PR, RC, RR, beta=0.1, lengths=lengths)
    torch.testing.assert_close(losses, -F.logsigmoid(0.1 * h_norm))
    ones = (torch.ones(2), torch.ones(2))
    torch.testing.assert_close(dpo_loss(PC, PR, RC, RR, lengths=ones)[0], dpo_loss(PC, PR, RC, RR)[0])
    with pytest.raises(ValueError, match="lengths"):
        dpo_loss(PC, PR, RC, RR, lengths=(torch.ones(3), torch.ones(2)))


def test_dpo_rejects_bad_arguments() -> None:
    with pytest.raises(KeyError, match="valid names: sigmoid, ipo, hinge, robust"):
        dpo_loss(PC, PR, RC, RR, loss_type="kto")
    with pytest.raises(ValueError, match="robust"):
        dpo_loss(PC, PR, RC, RR, loss_type="robust", label_smoothing=0.5)
    with pytest.raises(ValueError, match="beta"):
        dpo_loss(PC, PR, RC, RR, beta=0.0)
    assert len(PREFERENCE_LOSSES) == 4


def test_reward_model_loss_hand_computed() -> None:
    c, r = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 2.0])
    plain = -(F.logsigmoid(torch.tensor(1.0)) + F.logsigmoid(torch.tensor(-2.0))) / 2
    assert reward_model_loss(c, r).item() == pytest.approx(plain.item())
    m = torch.tensor([0.5, 0.5])
    with_margin = -(F.logsigmoid(torch.tensor(0.5)) + F.logsigmoid(torch.tensor(-2.5))) / 2
    assert reward_model_loss(c, r, margin=m).item() == pytest.approx(with_margin.item())
    centred = plain + 0.01 * (1.0 + 4.0) / 2
    assert reward_model_loss(c, r, center_coef=0.01).item() == pytest.approx(centred.item())


def test_value_loss_hand_computed() -> None:
    values = torch.tensor([[1.0, 3.0, 9.0]], requires_grad=True)
    old = torch.tensor([[0.0, 2.5, 0.0]])
    returns = torch.tensor([[2.0, 2.0, 0.0]])
    mask = torch.tensor([[True, True, False]])
    loss, frac = value_loss(values, old, returns, mask)
    assert loss.item() == pytest.approx(0.5 * (1.0 + 1.0) / 2) and frac == 0.0
    # clip 0.2: token 0 clipped value 0.2 -> err 3.24 > 1 (clipped term wins); token 1: 2.7 -> 0.49 < 1.
    loss, frac = value_loss(values, old, returns, mask, clip=0.2)
    assert loss.item() == pytest.approx(0.5 * (3.24 + 1.0) / 2) and frac == pytest.approx(0.5)
    loss.backward()
    torch.testing.assert_close(values.grad, torch.tensor([[0.0, 0.5, 0.0]]))  # clipped token: no gradient


def test_explained_variance() -> None:
    returns = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    mask = torch.tensor([[True, True, True, False]])
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)
    assert explained_variance(torch.full_like(returns, 2.0), returns, mask) == pytest.approx(0.0)
    assert explained_variance(returns + torch.tensor([[1.0, -1.0, 1.0, 0.0]]), returns, mask) < 0
    assert math.isnan(explained_variance(returns, torch.ones_like(returns), mask))
