"""logprob_mismatch: exact values on hand-built tensors, masked positions ignored, empty masks safe."""

from __future__ import annotations

import math

import pytest
import torch

from tandem.algos import logprob_mismatch

LOG2 = math.log(2.0)


def test_exact_values_on_a_hand_built_batch():
    behavior = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, -1.0, -1.0]])
    diff = torch.tensor([[0.1, -0.2, 0.0], [1.0, -1.0, 0.3]])  # |d| = .1 .2 0 | 1 1 (.3 masked)
    mask = torch.tensor([[True, True, True], [True, True, False]])
    out = logprob_mismatch(behavior + diff, behavior, mask)
    assert out["logprob_diff_mean"] == pytest.approx((0.1 + 0.2 + 0.0 + 1.0 + 1.0) / 5, abs=1e-6)
    assert out["logprob_diff_max"] == pytest.approx(1.0, abs=1e-6)
    # rho = e^1 > 2 and e^-1 < 0.5 leave [0.5, 2]; e^±0.2 and e^0.1 stay inside
    assert out["ratio_outside_frac"] == pytest.approx(2 / 5)


def test_identical_logprobs_give_zero():
    lp = -torch.rand(4, 6)
    out = logprob_mismatch(lp, lp.clone(), torch.ones(4, 6, dtype=torch.bool))
    assert out == {"logprob_diff_mean": 0.0, "logprob_diff_max": 0.0, "ratio_outside_frac": 0.0}


def test_just_inside_and_just_outside_the_bounds():
    behavior = torch.zeros(1, 4, dtype=torch.float64)
    trainer = torch.tensor([[LOG2 - 1e-9, -LOG2 + 1e-9, LOG2 + 1e-9, -LOG2 - 1e-9]], dtype=torch.float64)
    out = logprob_mismatch(trainer, behavior, torch.ones(1, 4, dtype=torch.bool))
    assert out["ratio_outside_frac"] == pytest.approx(0.5)


def test_custom_bounds():
    behavior = torch.zeros(1, 2)
    trainer = torch.tensor([[0.2, -0.05]])  # rho = 1.22, 0.95
    mask = torch.ones(1, 2, dtype=torch.bool)
    assert logprob_mismatch(trainer, behavior, mask, low=0.9, high=1.1)["ratio_outside_frac"] == 0.5


def test_masked_positions_are_ignored_whatever_they_hold():
    behavior = torch.tensor([[-1.0, -float("inf"), 5.0]])
    trainer = torch.tensor([[-1.5, float("nan"), -100.0]])
    mask = torch.tensor([[True, False, False]])
    out = logprob_mismatch(trainer, behavior, mask)
    assert out == pytest.approx(
        {"logprob_diff_mean": 0.5, "logprob_diff_max": 0.5, "ratio_outside_frac": 0.0}
    )


@pytest.mark.parametrize("shape", [(2, 3), (0, 3), (2, 0)])
def test_empty_mask_is_all_zero(shape):
    out = logprob_mismatch(torch.randn(shape), torch.randn(shape), torch.zeros(shape, dtype=torch.bool))
    assert out == {"logprob_diff_mean": 0.0, "logprob_diff_max": 0.0, "ratio_outside_frac": 0.0}


def test_no_gradient_and_inputs_untouched():
    trainer = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    behavior = torch.tensor([[-1.5, -2.0]])
    out = logprob_mismatch(trainer, behavior, torch.ones(1, 2, dtype=torch.bool))
    assert all(isinstance(v, float) for v in out.values())
    assert behavior.tolist() == [[-1.5, -2.0]]


def test_mean_is_token_weighted_so_halves_combine_exactly():
    """What the micro-batched update relies on: mean × tokens adds up over row splits."""
    g = torch.Generator().manual_seed(0)
    trainer, behavior = -torch.rand(6, 5, generator=g), -torch.rand(6, 5, generator=g)
    mask = torch.rand(6, 5, generator=g) > 0.3
    full = logprob_mismatch(trainer, behavior, mask)
    parts = [logprob_mismatch(trainer[s], behavior[s], mask[s]) for s in (slice(0, 2), slice(2, 6))]
    tokens = [int(mask[s].sum()) for s in (slice(0, 2), slice(2, 6))]
    for key in ("logprob_diff_mean", "ratio_outside_frac"):
        combined = sum(p[key] * t for p, t in zip(parts, tokens, strict=True)) / sum(tokens)
        assert combined == pytest.approx(full[key], rel=1e-12)
    assert max(p["logprob_diff_max"] for p in parts) == full["logprob_diff_max"]


def test_shape_mismatch_and_bad_bounds_are_errors():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="shapes differ"):
        logprob_mismatch(x, torch.zeros(2, 4), torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="low <= high"):
        logprob_mismatch(x, x, x.bool(), low=2.0, high=0.5)
