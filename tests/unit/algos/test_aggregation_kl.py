from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tandem.algos import AGGREGATIONS, AdaptiveKL, FixedKL, aggregate, kl_penalty, policy_loss

LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
MASK = torch.tensor([[True, True, True], [True, False, False], [False, False, False]])


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", (1 + 2 + 3 + 4) / 4),
        ("seq-mean-token-mean", (2.0 + 4.0) / 2),  # the fully masked row is not a sequence
        ("seq-mean-token-sum", (6.0 + 4.0) / 2),
        ("seq-mean-token-sum-norm", (6.0 / 3 + 4.0 / 3) / 2),
    ],
)
def test_aggregation_hand_computed(mode: str, expected: float) -> None:
    assert aggregate(LOSS, MASK, mode).item() == pytest.approx(expected)


def test_norm_constant_and_global_normalisers() -> None:
    assert aggregate(LOSS, MASK, "seq-mean-token-sum-norm", norm_constant=10).item() == pytest.approx(0.5)
    assert aggregate(LOSS, MASK, "token-mean", 8).item() == pytest.approx(10 / 8)
    assert aggregate(LOSS, MASK, "seq-mean-token-sum", global_seqs=5).item() == pytest.approx(10 / 5)
    with pytest.raises(ValueError, match="> 0"):
        aggregate(LOSS, MASK, "token-mean", 0)


def test_all_masked_aggregates_to_zero() -> None:
    for mode in AGGREGATIONS.names():
        assert aggregate(LOSS, torch.zeros_like(MASK), mode).item() == 0.0


@given(st.integers(2, 8), st.integers(1, 6), st.integers(0, 2**16), st.sampled_from(AGGREGATIONS.names()))
def test_micro_batch_split_matches_full_batch(b: int, t: int, seed: int, mode: str) -> None:
    """Summing micro-batch losses with global normalisers equals the full-batch loss, value and gradient."""
    gen = torch.Generator().manual_seed(seed)
    logprobs = (-torch.rand(b, t, generator=gen) * 3).requires_grad_(True)
    old = logprobs.detach() + 0.1 * torch.randn(b, t, generator=gen)
    adv = torch.randn(b, t, generator=gen)
    mask = torch.rand(b, t, generator=gen) > 0.4
    norms = dict(
        global_tokens=max(int(mask.sum()), 1), global_seqs=max(int(mask.any(-1).sum()), 1), norm_constant=t
    )
    kw = dict(clip_low=0.2, clip_high=0.28, aggregation=mode, **norms)
    full, _ = policy_loss(
        "ppo_clip", logprobs=logprobs, old_logprobs=old, advantages=adv, response_mask=mask, **kw
    )
    (g_full,) = torch.autograd.grad(full, logprobs)
    split = int(torch.randint(1, b, (1,), generator=gen))
    total = 0.0
    for sl in (slice(0, split), slice(split, b)):
        part, _ = policy_loss(
            "ppo_clip",
            logprobs=logprobs[sl],
            old_logprobs=old[sl],
            advantages=adv[sl],
            response_mask=mask[sl],
            **kw,
        )
        total = total + part
    (g_split,) = torch.autograd.grad(total, logprobs)
    torch.testing.assert_close(total, full)
    torch.testing.assert_close(g_split, g_full)


def test_kl_estimators_hand_computed() -> None:
    lp, ref = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.0]])
    d = lp - ref  # [0.5, -1.0]
    torch.testing.assert_close(kl_penalty(lp, ref, "k1"), d)
    torch.testing.assert_close(kl_penalty(lp, ref, "k2"), d**2 / 2)
    torch.testing.assert_close(kl_penalty(lp, ref, "k3"), torch.exp(-d) + d - 1)
    torch.testing.assert_close(kl_penalty(lp, ref, "low_var_kl"), kl_penalty(lp, ref, "k3"))
    torch.testing.assert_close(kl_penalty(lp, ref, "abs"), d.abs())
    with pytest.raises(KeyError, match="valid names: k1, k2, k3"):
        kl_penalty(lp, ref, "k4")


def test_k3_plus_has_k3_value_and_k2_gradient() -> None:
    lp = torch.tensor([[-1.0, -2.0, -0.3]], requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0, -0.3]])
    k3p = kl_penalty(lp, ref, "k3+")
    torch.testing.assert_close(k3p.detach(), kl_penalty(lp.detach(), ref, "k3"))
    (g_plus,) = torch.autograd.grad(k3p.sum(), lp)
    (g_k2,) = torch.autograd.grad(kl_penalty(lp, ref, "k2").sum(), lp)
    (g_k3,) = torch.autograd.grad(kl_penalty(lp, ref, "k3").sum(), lp)
    torch.testing.assert_close(g_plus, g_k2)
    assert not torch.allclose(g_plus, g_k3)  # the point of k3+: not k3's gradient


@given(st.floats(-80, 0), st.floats(-80, 0))
def test_k3_nonnegative_and_finite_gradient(a: float, b: float) -> None:
    lp = torch.tensor([a], requires_grad=True)
    k = kl_penalty(lp, torch.tensor([b]), "k3")
    k.sum().backward()
    assert float(k.detach()) >= 0.0 and torch.isfinite(lp.grad).all()


def test_k3_is_unbiased_for_kl_under_pi() -> None:
    """E_{y~pi}[k3] = KL(pi || pi_ref) exactly (expectation over all arms)."""
    pi = torch.tensor([0.5, 0.3, 0.2])
    ref = torch.tensor([0.2, 0.2, 0.6])
    exact = (pi * (pi / ref).log()).sum()
    for kind in ("k1", "k3"):
        est = (pi * kl_penalty(pi.log(), ref.log(), kind)).sum()
        torch.testing.assert_close(est, exact)


def test_kl_controllers() -> None:
    fixed = FixedKL(0.05)
    assert fixed.update(10.0, 100) == 0.05
    ctl = AdaptiveKL(value=0.1, target=6.0, horizon=10000)
    assert ctl.update(12.0, 1000) == pytest.approx(0.1 * (1 + 0.2 * 0.1))  # error clipped to +0.2
    assert ctl.update(3.0, 1000) == pytest.approx(0.1 * 1.02 * (1 - 0.2 * 0.1))  # 3/6 - 1 = -0.5 -> -0.2
    prev = ctl.value
    assert ctl.update(6.6, 1000) == pytest.approx(prev * (1 + 0.1 * 0.1))
    with pytest.raises(ValueError):
        AdaptiveKL(value=0.1, target=0.0, horizon=10)
