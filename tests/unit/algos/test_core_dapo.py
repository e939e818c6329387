from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tandem.algos import (
    entropy_from_logits,
    filter_groups,
    group_stats,
    last_token_mask,
    masked_mean,
    masked_var,
    masked_whiten,
    overlong_penalty,
    selective_log_softmax,
)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_selective_log_softmax_matches_naive(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(2, 5, 11, generator=gen) * 4).to(dtype)
    ids = torch.randint(0, 11, (2, 5), generator=gen)
    naive = torch.log_softmax(logits.float(), -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(selective_log_softmax(logits, ids), naive, rtol=1e-5, atol=1e-5)


def test_entropy_matches_definition() -> None:
    logits = torch.tensor([[0.0, 0.0], [10.0, -10.0]])
    p = logits.softmax(-1)
    torch.testing.assert_close(entropy_from_logits(logits), -(p * p.log()).sum(-1))


def test_masked_statistics() -> None:
    x = torch.tensor([[1.0, 2.0, 100.0], [3.0, 4.0, -50.0]])
    m = torch.tensor([[True, True, False], [True, True, False]])
    assert masked_mean(x, m).item() == pytest.approx(2.5)
    assert masked_var(x, m).item() == pytest.approx(torch.tensor([1.0, 2.0, 3.0, 4.0]).var().item())
    w = masked_whiten(x, m)
    assert (w[:, 2] == 0).all() and w[m].mean().abs() < 1e-6
    assert masked_mean(x, torch.zeros_like(m)).item() == 0.0


@given(st.lists(st.integers(0, 3), min_size=1, max_size=10), st.integers(0, 2**16))
def test_group_stats_matches_loop(ids: list[int], seed: int) -> None:
    v = torch.randn(len(ids), generator=torch.Generator().manual_seed(seed))
    gid = torch.tensor(ids)
    mean, std, n = group_stats(v, gid)
    for i, g in enumerate(ids):
        sel = v[gid == g]
        assert mean[i].item() == pytest.approx(sel.mean().item(), abs=1e-5)
        assert std[i].item() == pytest.approx(sel.std().item() if len(sel) > 1 else 0.0, abs=1e-5)
        assert n[i].item() == len(sel)


def test_last_token_mask_with_holes_and_empty_rows() -> None:
    m = torch.tensor([[True, False, True, False], [False, False, False, False], [True, True, True, True]])
    expected = torch.tensor([[False, False, True, False], [False] * 4, [False, False, False, True]])
    assert torch.equal(last_token_mask(m), expected)


def test_filter_groups_keeps_groups_with_signal() -> None:
    keep, frac = filter_groups(torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5]), torch.tensor([0, 0, 1, 1, 2]))
    assert keep.tolist() == [False, False, True, True, False] and frac == pytest.approx(1 / 3)


def test_overlong_penalty() -> None:
    out = overlong_penalty(torch.tensor([10, 12, 14, 16, 20]), max_len=16, buffer=4, factor=2.0)
    torch.testing.assert_close(out, torch.tensor([0.0, 0.0, -1.0, -2.0, -2.0]))
