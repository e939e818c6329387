"""The ``passk`` advantage estimator: the analytical pass@k group advantage (Chen et al. 2025)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from tandem.algos import compute_advantages
from tandem.algos.advantages import pass_k_advantages


def _brute_force(correct: list[bool], k: int) -> list[float]:
    """Per sample: the mean over all k-subsets containing it of (pass@k of the subset − the group's mean
    pass@k), divided by the std of the subsets' pass@k — what the closed form computes."""
    n = len(correct)
    subsets = list(itertools.combinations(range(n), k))
    value = {s: float(any(correct[i] for i in s)) for s in subsets}
    mean = sum(value.values()) / len(subsets)
    std = math.sqrt(sum((v - mean) ** 2 for v in value.values()) / len(subsets))
    out = []
    for i in range(n):
        mine = [value[s] for s in subsets if i in s]
        out.append((sum(mine) / len(mine) - mean) / std if std > 0 else 0.0)
    return out


@pytest.mark.parametrize("c", [1, 2, 5, 7])
@pytest.mark.parametrize("k", [1, 2, 4])
def test_closed_form_matches_the_subset_enumeration(c, k):
    correct = [True] * c + [False] * (8 - c)
    a_pos, a_neg = pass_k_advantages(8, c, k, eps=0.0)
    expected = _brute_force(correct, k)
    assert a_pos == pytest.approx(expected[0], abs=1e-9)
    assert a_neg == pytest.approx(expected[-1], abs=1e-9)


def test_k1_is_grpo_with_the_population_std_and_larger_k_spares_failures():
    scores = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    mask = torch.ones(8, 3, dtype=torch.bool)
    groups = torch.zeros(8, dtype=torch.long)
    k1, _ = compute_advantages("passk", scores=scores, response_mask=mask, group_ids=groups, pass_k=1)
    pop = (scores - scores.mean()) / (scores.std(unbiased=False) + 1e-6)
    torch.testing.assert_close(k1[:, 0], pop)
    k4, _ = compute_advantages("passk", scores=scores, response_mask=mask, group_ids=groups, pass_k=4)
    # 3 of 8 correct: pass@4 of a random subset is high, so a failure costs far less than under k = 1
    assert (k4[scores == 0, 0] < 0).all() and (k4[scores == 0, 0] > k1[scores == 0, 0] / 3).all()
    assert (k4[scores == 1, 0] > 0).all()


def test_all_equal_groups_get_zero_and_groups_are_independent():
    scores = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    groups = torch.tensor([0] * 4 + [1] * 4 + [2] * 4)
    mask = torch.ones(12, 2, dtype=torch.bool)
    mask[0, 1] = False
    adv, ret = compute_advantages("passk", scores=scores, response_mask=mask, group_ids=groups, pass_k=2)
    assert not adv[:8].any()
    a_pos, a_neg = pass_k_advantages(4, 1, 2)
    assert adv[8, 0].item() == pytest.approx(a_pos) and adv[9, 1].item() == pytest.approx(a_neg)
    assert adv[0, 1] == 0 and ret[0, 1] == 0  # masked positions stay zero
