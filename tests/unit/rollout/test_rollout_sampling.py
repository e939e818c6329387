"""Sampling primitives: top-k / top-p filters against naive loops, CDF draws, untruncated log-probs."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tandem.errors import ConfigError
from tandem.rollout import SamplingParams
from tandem.rollout.sampling import draw_categorical, filter_top_k, filter_top_p, sample_next


def _naive_top_p(row: torch.Tensor, p: float) -> set[int]:
    """Indices kept by nucleus filtering: most likely first until the mass reaches p."""
    probs = torch.softmax(row.double(), dim=-1)
    kept, mass = set(), 0.0
    for idx in torch.argsort(probs, descending=True).tolist():
        if kept and mass >= p:
            break
        kept.add(idx)
        mass += float(probs[idx])
    return kept


@settings(max_examples=40, deadline=None, derandomize=True)
@given(seed=st.integers(0, 10_000), k=st.integers(1, 12))
def test_top_k_keeps_k_largest(seed, k):
    logits = torch.randn((3, 12), generator=torch.Generator().manual_seed(seed))
    out = filter_top_k(logits, k)
    for row, filtered in zip(logits, out, strict=True):
        kept = set(torch.nonzero(torch.isfinite(filtered)).flatten().tolist())
        assert kept == set(torch.topk(row, k).indices.tolist())


@settings(max_examples=40, deadline=None, derandomize=True)
@given(seed=st.integers(0, 10_000), p=st.floats(0.05, 0.99))
def test_top_p_matches_naive(seed, p):
    logits = torch.randn((3, 10), generator=torch.Generator().manual_seed(seed)) * 2
    out = filter_top_p(logits, p)
    for row, filtered in zip(logits, out, strict=True):
        kept = set(torch.nonzero(torch.isfinite(filtered)).flatten().tolist())
        assert kept == _naive_top_p(row, p)


def test_draw_categorical_frequencies_and_zero_mass():
    probs = torch.tensor([[0.0, 0.2, 0.0, 0.8]]).repeat(20_000, 1)
    draws = draw_categorical(probs, torch.Generator().manual_seed(0))
    counts = torch.bincount(draws, minlength=4).float() / len(draws)
    assert counts[0] == 0 and counts[2] == 0
    assert abs(counts[1].item() - 0.2) < 0.02


def test_logprob_is_untruncated_and_greedy_uses_raw_logits():
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0]])
    params = SamplingParams(max_new_tokens=1, temperature=0.5, top_k=1)
    token, lp = sample_next(logits, params, torch.Generator().manual_seed(0))
    assert token.item() == 0
    torch.testing.assert_close(lp, torch.log_softmax(logits / 0.5, -1)[:, 0])
    token, lp = sample_next(logits, SamplingParams(max_new_tokens=1, temperature=0.0))
    assert token.item() == 0
    torch.testing.assert_close(lp, torch.log_softmax(logits, -1)[:, 0])


@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"top_p": 0.0}, "top_p"),
        ({"n": 0}, "n"),
        ({"stop": [""]}, "stop"),
    ],
)
def test_invalid_params_name_the_key(kwargs, key):
    with pytest.raises(ConfigError, match=f"rollout.{key}"):
        SamplingParams(**{"max_new_tokens": 4, **kwargs})
