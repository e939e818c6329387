from __future__ import annotations

import math
import re

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tandem.algos import CORRECTIONS, POLICY_LOSSES, correction_weights, policy_loss


def _lp(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32).requires_grad_(True)


def _call(name: str, logprobs, old, adv, mask=None, **kw):
    adv = torch.as_tensor(adv, dtype=torch.float32)
    mask = torch.ones_like(adv, dtype=torch.bool) if mask is None else mask
    return policy_loss(
        name, logprobs=logprobs, old_logprobs=torch.as_tensor(old), advantages=adv, response_mask=mask, **kw
    )


# ---------------------------------------------------------------- hand-computed cases


def test_ppo_clip_hand_computed_asymmetric_clip() -> None:
    # ratios e^{0.5}=1.65 (A>0, clipped at 1.28), e^{-0.5}=0.61 (A<0, clipped at 0.8), 1.1 (unclipped).
    old = torch.zeros(1, 3)
    lp = _lp([[0.5, -0.5, math.log(1.1)]])
    loss, m = _call("ppo_clip", lp, old, [[1.0, -2.0, 1.0]], clip_low=0.2, clip_high=0.28)
    expected = (-1.28 + 2.0 * 0.8 - 1.1) / 3
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    assert m["clipfrac_high"] == pytest.approx(1 / 3) and m["clipfrac_low"] == pytest.approx(1 / 3)
    assert m["clipfrac"] == pytest.approx(2 / 3)
    loss.backward()
    torch.testing.assert_close(lp.grad, torch.tensor([[0.0, 0.0, -1.1 / 3]]))  # clipped tokens: no gradient


def test_ppo_dual_clip_caps_negative_advantage_loss() -> None:
    lp = _lp([[math.log(5.0), math.log(2.0)]])
    loss, m = _call("ppo_clip", lp, torch.zeros(1, 2), [[-1.0, -1.0]], dual_clip=3.0)
    # token 0: max(5, 1.2)=5 capped by 3 -> 3; token 1: max(2, 1.2) = 2 < 3.
    assert loss.item() == pytest.approx((3.0 + 2.0) / 2)
    assert m["clipfrac_dual"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        _call("ppo_clip", lp, torch.zeros(1, 2), [[-1.0, -1.0]], dual_clip=0.5)


def test_decoupled_ppo_hand_computed() -> None:
    behav = torch.log(torch.tensor([[0.5, 0.1]]))
    old = torch.log(torch.tensor([[0.6, 0.4]]))  # w = 1.2, min(4, 2) = 2
    lp = _lp(torch.log(torch.tensor([[0.66, 0.4]])).tolist())  # u = 1.1, 1.0
    loss, m = _call("decoupled_ppo", lp, old, [[1.0, 1.0]], behavior_logprobs=behav, correction_high=2.0)
    assert loss.item() == pytest.approx((-1.2 * 1.1 - 2.0 * 1.0) / 2, rel=1e-5)
    assert m["behav_weight_capped_frac"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="needs behavior_logprobs"):
        _call("decoupled_ppo", lp, old, [[1.0, 1.0]])
    with pytest.raises(ValueError, match="already corrects"):
        _call("decoupled_ppo", lp, old, [[1.0, 1.0]], behavior_logprobs=behav, correction="token_tis")


def test_gspo_uses_length_normalised_sequence_ratio() -> None:
    # seq 0: mean log-ratio (0.1 + 0.3)/2 = 0.2 -> s = e^0.2 = 1.221 > 1 + 0.2: clipped at 1.2 (A = 1).
    # seq 1: one valid token, log-ratio 0.05 -> s = e^0.05 (A = -1).
    mask = torch.tensor([[True, True], [True, False]])
    lp = _lp([[0.1, 0.3], [0.05, 7.0]])
    loss, m = _call(
        "gspo",
        lp,
        torch.zeros(2, 2),
        [[1.0, 1.0], [-1.0, -1.0]],
        mask=mask,
        aggregation="seq-mean-token-mean",
    )
    assert loss.item() == pytest.approx((-1.2 + math.exp(0.05)) / 2, rel=1e-5)
    loss.backward()
    torch.testing.assert_close(lp.grad, torch.tensor([[0.0, 0.0], [math.exp(0.05) / 2, 0.0]]))


def test_cispo_clips_weight_but_keeps_gradient() -> None:
    lp = _lp([[0.5, 0.0]])  # ratio e^0.5 -> weight clipped to 1.2
    loss, m = _call("cispo", lp, torch.zeros(1, 2), [[1.0, 2.0]])
    assert loss.item() == pytest.approx((-1.2 - 2.0) / 2)
    loss.backward()
    torch.testing.assert_close(lp.grad, torch.tensor([[-1.2 / 2, -2.0 / 2]]))  # clipped token still learns
    assert m["clipfrac_high"] == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("name", "reference", "aggregation"),
    [("gspo", "ppo_clip", "seq-mean-token-mean"), ("cispo", "ppo_clip", "token-mean")],
)
def test_on_policy_gradient_equals_ppo_clip(name: str, reference: str, aggregation: str) -> None:
    """With one optimiser step per batch the ratio is exactly 1 (``old = logprobs``): GSPO's sequence
    ratio and CISPO's stop-gradient weight give the plain policy gradient, as PPO-clip does. Their
    differences are off-policy only (docs/learning.md, "Which algorithm for an outside model")."""
    gen = torch.Generator().manual_seed(0)
    values = torch.randn(4, 5, generator=gen) - 2.0
    mask = torch.ones(4, 5, dtype=torch.bool)
    mask[1, 3:] = mask[2, 1:] = False
    adv = torch.randn(4, 1, generator=gen).expand(4, 5)
    grads = []
    for loss_name in (name, reference):
        lp = _lp(values.tolist())
        loss, _ = _call(loss_name, lp, lp.detach(), adv, mask=mask, aggregation=aggregation)
        loss.backward()
        grads.append(lp.grad)
    torch.testing.assert_close(grads[0], grads[1])
    assert grads[0].abs().sum() > 0


def test_topr_tapers_only_negative_samples() -> None:
    # seq 0: A>0, far off-policy -> weight 1. seq 1: A<0, pi/mu = e^{-1} -> weight e^{-1}.
    # seq 2: A<0, pi/mu = e^{+1} -> weight clipped to 1.
    mask = torch.ones(3, 2, dtype=torch.bool)
    lp = _lp([[-3.0, -3.0], [-1.0, -1.0], [-1.0, -1.0]])
    mu = torch.tensor([[-1.0, -1.0], [-0.5, -0.5], [-1.5, -1.5]])
    loss, m = _call(
        "topr", lp, lp.detach(), [[1.0, 1.0], [-1.0, -1.0], [-1.0, -1.0]], mask=mask, behavior_logprobs=mu
    )
    loss.backward()
    w = torch.tensor([1.0, math.exp(-1.0), 1.0]).unsqueeze(-1) * torch.tensor(
        [[1.0, 1.0], [-1.0, -1.0], [-1.0, -1.0]]
    )
    torch.testing.assert_close(lp.grad, -w / 6)
    assert loss.item() == pytest.approx(float(-w.sum() / 6))
    assert m["topr_neg_frac"] == pytest.approx(2 / 3)


def test_agro_hand_computed() -> None:
    # one group of 3 one-token samples; regularised reward R - beta * (log pi - log pi_ref).
    lp = _lp([[-1.0], [-2.0], [-0.5]])
    ref = torch.tensor([[-1.5], [-1.0], [-0.5]])
    scores = torch.tensor([1.0, 0.0, 0.5])
    beta = 0.5
    reg = scores - beta * torch.tensor([0.5, -1.0, 0.0])  # [0.75, 0.5, 0.5]
    adv = reg - reg.mean()
    loss, m = _call(
        "agro",
        lp,
        lp.detach(),
        torch.zeros(3, 1),
        ref_logprobs=ref,
        scores=scores,
        group_ids=torch.zeros(3),
        beta=beta,
    )
    loss.backward()
    torch.testing.assert_close(lp.grad, -adv.unsqueeze(-1) / 3)
    assert m["agro_consistency"] == pytest.approx(float((adv**2).mean()))
    assert "kl_loss" not in m  # agro owns its KL term
    with pytest.raises(ValueError, match="needs scores"):
        _call("agro", lp, lp.detach(), torch.zeros(3, 1), ref_logprobs=ref, beta=beta)


def test_kl_in_loss_adds_beta_k3() -> None:
    lp = _lp([[-1.0, -2.0]])
    ref = torch.tensor([[-1.5, -1.0]])
    base, _ = _call("ppo_clip", lp, lp.detach(), [[1.0, 1.0]])
    with_kl, m = _call("ppo_clip", lp, lp.detach(), [[1.0, 1.0]], ref_logprobs=ref, beta=0.1)
    d = ref - lp.detach()
    k3 = (d.exp() - d - 1).mean()
    assert with_kl.item() == pytest.approx(base.item() + 0.1 * k3.item(), rel=1e-5)
    assert m["kl_ref"] == pytest.approx(k3.item(), rel=1e-5)
    with pytest.raises(ValueError, match="needs ref_logprobs"):
        _call("ppo_clip", lp, lp.detach(), [[1.0, 1.0]], beta=0.1)


def test_unknown_names_list_valid_ones() -> None:
    lp = _lp([[0.0]])
    with pytest.raises(KeyError, match="valid names: ppo_clip"):
        _call("ppo", lp, lp.detach(), [[1.0]])
    with pytest.raises(KeyError, match="valid names: token_tis"):
        _call("ppo_clip", lp, lp.detach(), [[1.0]], correction="tis", behavior_logprobs=lp.detach())
    with pytest.raises(KeyError, match="valid names: token-mean"):
        _call("ppo_clip", lp, lp.detach(), [[1.0]], aggregation="mean")


# ---------------------------------------------------------------- rollout corrections


def test_correction_weights_hand_computed() -> None:
    old = torch.log(torch.tensor([[0.5, 0.9, 0.2]]))
    behav = torch.log(torch.tensor([[0.1, 0.9, 0.5]]))  # rho = 5, 1, 0.4; prod = 2
    mask = torch.ones(1, 3, dtype=torch.bool)
    tw = correction_weights("token_tis", old, behav, mask, high=2.0)
    torch.testing.assert_close(tw, torch.tensor([[2.0, 1.0, 0.4]]))
    torch.testing.assert_close(
        correction_weights("seq_tis", old, behav, mask, high=1.5), torch.full((1, 3), 1.5)
    )
    tm = correction_weights("token_mis", old, behav, mask, high=2.0)  # low defaults to 0.5
    torch.testing.assert_close(tm, torch.tensor([[0.0, 1.0, 0.0]]))
    tm = correction_weights("token_mis", old, behav, mask, low=0.3, high=2.0)  # IcePop: rho inside bounds
    torch.testing.assert_close(tm, torch.tensor([[0.0, 1.0, 0.4]]))
    tr = correction_weights("token_rs", old, behav, mask, low=0.3, high=2.0)  # rejection: 1 inside bounds
    torch.testing.assert_close(tr, torch.tensor([[0.0, 1.0, 1.0]]))
    torch.testing.assert_close(
        correction_weights("seq_mis", old, behav, mask, high=2.5), torch.full((1, 3), 2.0)
    )
    torch.testing.assert_close(correction_weights("seq_rs", old, behav, mask, high=2.5), torch.ones(1, 3))
    for kind in ("seq_mis", "seq_rs"):
        torch.testing.assert_close(
            correction_weights(kind, old, behav, mask, low=0.1, high=1.9), torch.zeros(1, 3)
        )


def test_correction_multiplies_policy_loss_and_reports_stats() -> None:
    old = torch.zeros(1, 2)
    behav = torch.tensor([[math.log(0.25), 0.0]])  # rho = 4 (masked out), 1
    lp = _lp([[0.0, 0.0]])
    loss, m = _call("ppo_clip", lp, old, [[1.0, 3.0]], behavior_logprobs=behav, correction="token_mis")
    assert loss.item() == pytest.approx(-3.0 / 2)
    assert m["correction_masked_frac"] == 0.5 and m["correction_weight_min"] == 0.0
    assert m["correction_weight_max"] == 1.0 and m["correction_weight_mean"] == 0.5
    with pytest.raises(ValueError, match="needs behavior_logprobs"):
        _call("ppo_clip", lp, old, [[1.0, 3.0]], correction="token_tis")


# ---------------------------------------------------------------- properties and robustness


@given(st.integers(1, 4), st.integers(1, 6), st.integers(0, 2**16))
def test_ratio_one_ppo_is_minus_mean_advantage(b: int, t: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    lp = (torch.rand(b, t, generator=gen) * -5).requires_grad_(True)
    adv = torch.randn(b, t, generator=gen)
    mask = torch.rand(b, t, generator=gen) > 0.3
    loss, m = _call("ppo_clip", lp, lp.detach(), adv, mask=mask, clip_low=0.2, clip_high=0.28)
    n = max(int(mask.sum()), 1)
    assert loss.item() == pytest.approx(float(-(adv * mask).sum() / n), abs=1e-5)
    assert m["clipfrac"] == 0.0 and m["approx_kl"] == pytest.approx(0.0, abs=1e-7)
    if mask.any():
        assert m["ratio_mean"] == pytest.approx(1.0)


_EXTREME = dict(
    behavior_logprobs=torch.tensor([[-50.0, 0.0, -0.01], [0.0, -50.0, -3.0]]),
    ref_logprobs=torch.tensor([[0.0, -50.0, -0.01], [-50.0, 0.0, -3.0]]),
    scores=torch.tensor([1e4, -1e4]),
    group_ids=torch.tensor([0, 0]),
    beta=0.1,
)


_LOSS_X_CORRECTION = [
    (name, corr)
    for name in POLICY_LOSSES.names()
    for corr in (None, *CORRECTIONS.names())
    if corr is None or not POLICY_LOSSES.get(name).owns_behavior_correction
]


@pytest.mark.parametrize(("name", "correction"), _LOSS_X_CORRECTION)
def test_gradients_finite_for_extreme_inputs(name: str, correction: str | None) -> None:
    lp = _lp([[-50.0, -1e-6, -20.0], [-0.1, -50.0, -3.0]])
    old = torch.tensor([[0.0, -50.0, -20.0], [-50.0, 0.0, -3.0]])
    adv = torch.tensor([[1e4, -1e4, 1e4], [-1e4, 1e4, -1e4]])
    dual = {"dual_clip": 3.0} if "dual_clip" in POLICY_LOSSES.get(name).option_names() else {}
    loss, m = _call(name, lp, old, adv, correction=correction, **dual, **_EXTREME)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(lp.grad).all()
    assert all(math.isfinite(v) for v in m.values()), m


@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_padding_with_garbage_does_not_leak(name: str) -> None:
    mask = torch.tensor([[True, False]])
    kw = dict(
        behavior_logprobs=torch.tensor([[-1.0, float("nan")]]), scores=torch.ones(1), group_ids=torch.zeros(1)
    )
    lp_a, lp_b = _lp([[-1.0, 0.0]]), _lp([[-1.0, -30.0]])
    a, _ = _call(name, lp_a, torch.tensor([[-1.1, 0.0]]), [[1.0, 0.0]], mask=mask, **kw)
    b, _ = _call(name, lp_b, torch.tensor([[-1.1, float("inf")]]), [[1.0, float("nan")]], mask=mask, **kw)
    assert a.item() == pytest.approx(b.item())
    (a + b).backward()
    torch.testing.assert_close(lp_a.grad, lp_b.grad)
    assert lp_b.grad[0, 1] == 0.0


def test_fully_masked_batch_gives_zero_loss_and_finite_metrics() -> None:
    lp = _lp([[0.1, 0.2]])
    loss, m = _call("ppo_clip", lp, torch.zeros(1, 2), [[1.0, 1.0]], mask=torch.zeros(1, 2, dtype=torch.bool))
    assert loss.item() == 0.0 and all(math.isfinite(v) for v in m.values())


# ---------------------------------------------------------------- per-loss options


def test_options_object_and_keywords_give_the_same_loss() -> None:
    from tandem.algos import ClipOptions

    lp, old, adv = _lp([[0.5, -0.5]]), torch.zeros(1, 2), [[1.0, -1.0]]
    by_kw, _ = _call("ppo_clip", lp, old, adv, clip_low=0.1, clip_high=0.3)
    by_obj, _ = _call("ppo_clip", lp, old, adv, options=ClipOptions(clip_low=0.1, clip_high=0.3))
    mixed, _ = _call("ppo_clip", lp, old, adv, options=ClipOptions(clip_low=0.1), clip_high=0.3)
    assert by_kw.item() == by_obj.item() == mixed.item()


@pytest.mark.parametrize(
    ("name", "kw", "message"),
    [
        (
            "topr",
            {"clip_high": 0.3},
            "policy loss 'topr': unknown option clip_high; this loss's options: none",
        ),
        ("cispo", {"dual_clip": 3.0}, "unknown option dual_clip; this loss's options: clip_low, clip_high"),
        ("ppo_clip", {"options": 0.2}, "options must be a ClipOptions, got float"),
    ],
)
def test_options_a_loss_does_not_have_are_refused(name: str, kw: dict, message: str) -> None:
    extra = dict(behavior_logprobs=torch.zeros(1, 2), scores=torch.ones(1), group_ids=torch.zeros(1))
    with pytest.raises(ValueError, match=re.escape(message)):
        _call(name, _lp([[0.1, 0.2]]), torch.zeros(1, 2), [[1.0, 1.0]], **extra, **kw)


def test_every_loss_declares_its_options_with_descriptions() -> None:
    import dataclasses

    for name in POLICY_LOSSES:
        spec = POLICY_LOSSES.get(name)
        if spec.options is None:
            assert spec.option_names() == [] and spec.make_options() is None
            continue
        assert dataclasses.is_dataclass(spec.options), name
        for f in dataclasses.fields(spec.options):
            assert f.metadata.get("description"), f"{name}.{f.name} has no description"
            assert f.default is not dataclasses.MISSING, f"{name}.{f.name} has no default"
