from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tandem.algos import ADVANTAGE_ESTIMATORS, compute_advantages, discounted_returns, gae_scan, masked_whiten

# ---------------------------------------------------------------- helpers


def _mask(lengths: list[int], t: int) -> torch.Tensor:
    return torch.arange(t).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)  # [B, T]


def _adv(name: str, scores: list[float], ids: list[int], lengths: list[int], t: int = 3, **kw):
    return compute_advantages(
        name,
        scores=torch.tensor(scores),
        response_mask=_mask(lengths, t),
        group_ids=torch.tensor(ids),
        **kw,
    )


def _loop_group(scores: list[float], ids: list[int], kind: str, eps: float = 1e-6) -> list[float]:
    """Reference implementation: one Python loop per sample."""
    out = []
    for i, (s, g) in enumerate(zip(scores, ids, strict=True)):
        grp = [scores[j] for j in range(len(scores)) if ids[j] == g]
        n = len(grp)
        mean = sum(grp) / n
        std = math.sqrt(sum((x - mean) ** 2 for x in grp) / (n - 1)) if n > 1 else 0.0
        others = [scores[j] for j in range(len(scores)) if ids[j] == g and j != i]
        if kind == "grpo":
            out.append((s - mean) / (std + eps))
        elif kind == "dr_grpo":
            out.append(s - mean)
        else:  # rloo
            out.append(s - sum(others) / len(others) if others else 0.0)
    return out


def _loop_gae(rewards, values, mask, gamma, lam):
    """Reference GAE: per row, iterate over the valid positions only."""
    out = torch.zeros_like(rewards)
    for b in range(rewards.shape[0]):
        pos = [t for t in range(rewards.shape[1]) if mask[b, t]]
        nxt_v, nxt_a = 0.0, 0.0
        for t in reversed(pos):
            delta = float(rewards[b, t]) + gamma * nxt_v - float(values[b, t])
            a = delta + gamma * lam * nxt_a
            out[b, t] = a
            nxt_v, nxt_a = float(values[b, t]), a
    return out


group_case = st.integers(1, 4).flatmap(
    lambda g: st.tuples(
        st.lists(st.integers(0, g - 1), min_size=2, max_size=12),
        st.integers(0, 2**16),
    )
)


# ---------------------------------------------------------------- hand-computed cases


def test_grpo_hand_computed() -> None:
    adv, ret = _adv("grpo", [1.0, 0.0, 2.0, 2.0], [0, 0, 1, 1], [3, 2, 1, 3])
    a = 0.5 / (math.sqrt(0.5) + 1e-6)  # mean 0.5, unbiased std sqrt(0.5)
    expected = torch.tensor([[a, a, a], [-a, -a, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(ret[:, 0], torch.tensor([1.0, 0.0, 2.0, 2.0]))
    assert ret[2, 1] == 0.0  # masked


def test_grpo_batch_std_keeps_the_group_mean_and_divides_by_the_batch_std() -> None:
    scores = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0]  # a group with one success, one with three
    ids = [0, 0, 0, 0, 1, 1, 1, 1]
    adv, _ = _adv("grpo", scores, ids, [1] * 8, t=1, std_scope="batch")
    batch_std = torch.tensor(scores).std()  # unbiased, over all 8 (TRL's scale_rewards="batch")
    means = torch.tensor([0.25] * 4 + [0.75] * 4)
    torch.testing.assert_close(adv[:, 0], (torch.tensor(scores) - means) / (batch_std + 1e-6))
    group_adv, _ = _adv("grpo", scores, ids, [1] * 8, t=1)  # group std 0.5 < batch std 0.53
    assert float(adv.abs().max()) < float(group_adv.abs().max())
    one, _ = _adv("grpo", [1.0], [0], [1], t=1, std_scope="batch")  # a batch of one: no std, no nan
    assert torch.isfinite(one).all()


def test_grpo_without_std_is_dr_grpo() -> None:
    a1, _ = _adv("grpo", [1.0, 0.0, 3.0], [0, 0, 0], [3, 3, 3], norm_by_std=False)
    a2, _ = _adv("dr_grpo", [1.0, 0.0, 3.0], [0, 0, 0], [3, 3, 3])
    torch.testing.assert_close(a1, a2)
    torch.testing.assert_close(a2[:, 0], torch.tensor([-1 / 3, -4 / 3, 5 / 3]))


def test_rloo_hand_computed() -> None:
    adv, _ = _adv("rloo", [1.0, 0.0, 2.0], [7, 7, 7], [1, 1, 1], t=1)
    torch.testing.assert_close(adv[:, 0], torch.tensor([1.0 - 1.0, 0.0 - 1.5, 2.0 - 0.5]))


def test_remax_hand_computed_and_requires_baseline() -> None:
    adv, _ = _adv("remax", [1.0, 0.5], [0, 1], [2, 1], t=2, baseline_scores=torch.tensor([0.25, 1.0]))
    torch.testing.assert_close(adv, torch.tensor([[0.75, 0.75], [-0.5, 0.0]]))
    with pytest.raises(ValueError, match="needs baseline_scores"):
        _adv("remax", [1.0], [0], [1])


def test_gae_hand_computed() -> None:
    # one row, 2 valid tokens of 3, gamma 0.5, lambda 0.5, reward 1 on the last valid token.
    values = torch.tensor([[0.2, 0.4, 9.0]])
    adv, ret = compute_advantages(
        "gae",
        scores=torch.tensor([1.0]),
        response_mask=_mask([2], 3),
        group_ids=torch.tensor([0]),
        values=values,
        gamma=0.5,
        lam=0.5,
        norm_by_std=False,
    )
    d1 = 1.0 - 0.4  # last valid token: r + 0 - V
    d0 = 0.0 + 0.5 * 0.4 - 0.2
    torch.testing.assert_close(adv, torch.tensor([[d0 + 0.25 * d1, d1, 0.0]]))
    torch.testing.assert_close(ret, torch.tensor([[d0 + 0.25 * d1 + 0.2, d1 + 0.4, 0.0]]))


def test_gae_whitened_over_valid_tokens_and_requires_values() -> None:
    adv, _ = compute_advantages(
        "gae",
        scores=torch.tensor([1.0, 0.0]),
        response_mask=_mask([3, 2], 3),
        group_ids=torch.tensor([0, 1]),
        values=torch.rand(2, 3),
        gamma=0.9,
        lam=0.8,
    )
    valid = adv[_mask([3, 2], 3)]
    assert abs(float(valid.mean())) < 1e-5 and abs(float(valid.std()) - 1.0) < 1e-3
    with pytest.raises(ValueError, match="needs values"):
        _adv("gae", [1.0], [0], [1])
    assert ADVANTAGE_ESTIMATORS.get("gae").needs_critic and not ADVANTAGE_ESTIMATORS.get("grpo").needs_critic


def test_reinforce_pp_hand_computed() -> None:
    # gamma 1: return-to-go of (score on last token + token rewards), then whitened over valid tokens.
    token_rewards = torch.tensor([[-0.1, -0.1, 0.0], [0.0, -0.2, 0.0]])
    adv, ret = compute_advantages(
        "reinforce_pp",
        scores=torch.tensor([1.0, 0.0]),
        response_mask=_mask([3, 2], 3),
        group_ids=torch.tensor([0, 0]),
        token_rewards=token_rewards,
    )
    expected_ret = torch.tensor([[0.8, 0.9, 1.0], [-0.2, -0.2, 0.0]])
    torch.testing.assert_close(ret, expected_ret)
    valid = expected_ret[_mask([3, 2], 3)]
    torch.testing.assert_close(adv[_mask([3, 2], 3)], (valid - valid.mean()) / (valid.var() + 1e-8).sqrt())


def test_reinforce_pp_baseline_subtracts_group_mean_first() -> None:
    adv, ret = _adv("reinforce_pp_baseline", [1.0, 0.0, 5.0, 5.0], [0, 0, 1, 1], [1, 1, 1, 1], t=1)
    torch.testing.assert_close(ret[:, 0], torch.tensor([0.5, -0.5, 0.0, 0.0]))
    x = torch.tensor([0.5, -0.5, 0.0, 0.0])
    torch.testing.assert_close(adv[:, 0], (x - x.mean()) / (x.var() + 1e-8).sqrt())


def test_discount_skips_holes_in_the_mask() -> None:
    rewards = torch.tensor([[1.0, 5.0, 2.0, 0.0]])
    mask = torch.tensor([[True, False, True, False]])
    out = discounted_returns(rewards, mask, 0.5)
    torch.testing.assert_close(out, torch.tensor([[1.0 + 0.5 * 2.0, 0.0, 2.0, 0.0]]))


# ---------------------------------------------------------------- edge cases


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline"])
def test_edge_cases_never_nan(name: str) -> None:
    # group 0 has one sample; group 1 has zero std; row 3 is fully masked; lengths are ragged.
    adv, ret = _adv(name, [1.0, 2.0, 2.0, 3.0], [0, 1, 1, 2], [3, 1, 2, 0])
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()
    assert (adv[3] == 0).all() and (ret[3] == 0).all()
    assert adv[1, 1:].eq(0).all()  # masked positions are zero
    if name in ("grpo", "dr_grpo", "rloo"):
        assert adv[0].eq(0).all() and adv[1:3].eq(0).all()  # singleton and zero-std groups give 0


def test_empty_batches_stay_empty() -> None:
    for b, t in ((0, 3), (2, 0)):
        assert masked_whiten(torch.zeros(b, t), torch.zeros(b, t, dtype=torch.bool)).shape == (b, t)
    m = torch.zeros(0, 3, dtype=torch.bool)
    for name in ("grpo", "reinforce_pp_baseline"):
        adv, _ = compute_advantages(
            name, scores=torch.zeros(0), response_mask=m, group_ids=torch.zeros(0).long()
        )
        assert adv.shape == (0, 3)


def test_all_masked_batch_is_finite() -> None:
    for name in ADVANTAGE_ESTIMATORS.names():
        inputs = {"values": torch.zeros(2, 3), "baseline_scores": torch.zeros(2)}
        inputs |= {"logprobs": torch.zeros(2, 3), "teacher_logprobs": torch.zeros(2, 3)}
        adv, ret = _adv(name, [1.0, 0.0], [0, 0], [0, 0], **inputs)
        assert (adv == 0).all() and (ret == 0).all(), name


def test_shape_errors_are_explained() -> None:
    with pytest.raises(ValueError, match="scores and group_ids"):
        _adv("grpo", [1.0, 2.0], [0], [1, 1])
    with pytest.raises(ValueError, match="values must have shape"):
        _adv("gae", [1.0], [0], [1], values=torch.zeros(2, 3))


# ---------------------------------------------------------------- vectorised == loop, properties


@given(group_case)
def test_group_estimators_match_loop(case) -> None:
    ids, seed = case
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randint(0, 3, (len(ids),), generator=gen).float() + torch.rand(len(ids), generator=gen)
    for kind in ("grpo", "dr_grpo", "rloo"):
        adv, _ = _adv(kind, scores.tolist(), ids, [1] * len(ids), t=1)
        expected = torch.tensor(_loop_group(scores.tolist(), ids, kind))
        torch.testing.assert_close(adv[:, 0], expected, rtol=1e-4, atol=1e-4)


@given(group_case)
def test_grpo_and_dr_grpo_sum_to_zero_per_group(case) -> None:
    ids, seed = case
    scores = torch.randn(len(ids), generator=torch.Generator().manual_seed(seed)) * 5
    gid = torch.tensor(ids)
    for kind in ("grpo", "dr_grpo"):
        adv, _ = _adv(kind, scores.tolist(), ids, [1] * len(ids), t=1)
        for g in gid.unique():
            assert abs(float(adv[gid == g, 0].sum())) < 1e-3


@given(group_case)
def test_rloo_is_scaled_mean_centering(case) -> None:
    ids, seed = case
    scores = torch.randn(len(ids), generator=torch.Generator().manual_seed(seed))
    adv, _ = _adv("rloo", scores.tolist(), ids, [1] * len(ids), t=1)
    gid = torch.tensor(ids)
    for g in gid.unique():
        sel = gid == g
        n = int(sel.sum())
        if n > 1:
            expected = n / (n - 1) * (scores[sel] - scores[sel].mean())
            torch.testing.assert_close(adv[sel, 0], expected, rtol=1e-5, atol=1e-5)


@given(st.integers(1, 5), st.integers(1, 7), st.floats(0.5, 1.0), st.floats(0.0, 1.0), st.integers(0, 2**16))
def test_gae_matches_loop(b: int, t: int, gamma: float, lam: float, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    rewards, values = torch.randn(b, t, generator=gen), torch.randn(b, t, generator=gen)
    mask = torch.rand(b, t, generator=gen) > 0.3  # holes and fully masked rows included
    torch.testing.assert_close(
        gae_scan(rewards, values, mask, gamma, lam), _loop_gae(rewards, values, mask, gamma, lam)
    )


# ---------------------------------------------------------------- constant groups give exactly 0

# Float32 values of any magnitude and sign, including the fractional ones whose float mean is one ulp off.
_any_reward = st.floats(-1e6, 1e6, allow_nan=False, width=32)


def test_constant_fractional_group_gives_exactly_zero() -> None:
    """The reported defect: 8 samples all rewarded 3.3 got a GRPO advantage of 0.19 (the float32 group mean
    is one ulp off 3.3 and dividing by std + 1e-6 magnified it)."""
    for name in ("grpo", "dr_grpo", "rloo", "reinforce_pp_baseline"):
        adv, _ = _adv(name, [3.3] * 8, [0] * 8, [3] * 8)
        assert adv.eq(0).all(), (name, adv[:, 0].tolist())


@given(
    _any_reward,
    st.integers(2, 16),
    st.lists(st.tuples(_any_reward, st.integers(1, 6)), max_size=4),
    st.integers(0, 2**16),
)
def test_constant_group_is_exactly_zero_among_any_groups(
    value: float, n: int, others: list[tuple[float, int]], seed: int
) -> None:
    """A group of ``n`` equal rewards gets advantage exactly 0 from every group-relative estimator,
    whatever the value and whatever the other groups of the batch hold."""
    gen = torch.Generator().manual_seed(seed)
    scores, ids = [value] * n, [0] * n
    for g, (scale, size) in enumerate(others, start=1):
        scores += (torch.randn(size, generator=gen) * scale).tolist()
        ids += [g] * size
    lengths = torch.randint(1, 4, (len(ids),), generator=gen).tolist()
    for name in ("grpo", "dr_grpo", "rloo"):
        adv, _ = _adv(name, scores, ids, lengths)
        assert adv[:n].eq(0).all(), (name, value, adv[:n, 0].tolist())
    # REINFORCE++-baseline centres each group (exactly 0 here) and then whitens over the whole batch, so the
    # constant group's tokens share one value, and that value is exactly 0 when every group is constant.
    adv, ret = _adv("reinforce_pp_baseline", scores, ids, lengths)
    assert ret[:n].eq(0).all()
    valid = adv[:n][_mask(lengths[:n], 3)]
    assert valid.eq(valid[0]).all()


@given(st.lists(st.tuples(_any_reward, st.integers(1, 8)), min_size=1, max_size=5))
def test_batch_of_constant_groups_is_exactly_zero(groups: list[tuple[float, int]]) -> None:
    scores = [v for v, size in groups for _ in range(size)]
    ids = [g for g, (_, size) in enumerate(groups) for _ in range(size)]
    for name in ("grpo", "dr_grpo", "rloo", "reinforce_pp_baseline"):
        adv, _ = _adv(name, scores, ids, [3] * len(ids))
        assert adv.eq(0).all(), (name, groups)


@given(_any_reward, st.integers(1, 6), st.integers(1, 5))
def test_whitening_a_constant_batch_is_exactly_zero(value: float, b: int, t: int) -> None:
    """Batch whitening (``reinforce_pp``; ``gae``'s final step) of equal returns gives 0, not ulp noise
    magnified by ``rsqrt(0 + 1e-8)``."""
    adv, ret = compute_advantages(
        "reinforce_pp",
        scores=torch.full((b,), value),
        response_mask=torch.ones(b, t, dtype=torch.bool),
        group_ids=torch.arange(b),
        gamma=1.0,
    )
    assert ret.eq(value).all() and adv.eq(0).all()
