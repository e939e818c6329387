"""Sampling primitives: top-k / top-p filters against naive loops, CDF draws, untruncated log-probs."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tandem.errors import ConfigError
from tandem.rollout import SamplingParams
from tandem.rollout.sampling import (
    draw_categorical,
    filter_min_p,
    filter_top_k,
    filter_top_p,
    penalise_repeats,
    sample_next,
    seen_tokens,
)


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
        ({"min_p": 1.5}, "min_p"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ],
)
def test_invalid_params_name_the_key(kwargs, key):
    with pytest.raises(ConfigError, match=f"rollout.{key}"):
        SamplingParams(**{"max_new_tokens": 4, **kwargs})


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), min_p=st.sampled_from([0.0, 0.01, 0.1, 0.5, 1.0]))
def test_min_p_matches_hugging_face(seed, min_p):
    from transformers.generation.logits_process import MinPLogitsWarper

    logits = torch.randn(3, 11, generator=torch.Generator().manual_seed(seed)) * 3
    ours = filter_min_p(logits, min_p)
    if min_p == 0:
        assert torch.equal(ours, logits)
        return
    theirs = MinPLogitsWarper(min_p)(torch.zeros(3, 1, dtype=torch.long), logits.clone())
    assert torch.equal(torch.isinf(ours), torch.isinf(theirs))
    assert (~torch.isinf(ours)).any(dim=-1).all()  # the likeliest token always stays


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), penalty=st.sampled_from([0.5, 1.0, 1.3, 2.0]))
def test_repetition_penalty_matches_hugging_face(seed, penalty):
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(2, 9, generator=g) * 2
    ids = torch.randint(0, 9, (2, 5), generator=g)
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[1, :2] = False  # left padding: those ids are not seen
    ours = penalise_repeats(logits, seen_tokens(ids, mask, 9), penalty)
    rows = [
        RepetitionPenaltyLogitsProcessor(penalty)(
            ids[i : i + 1][mask[i : i + 1]].view(1, -1), logits[i : i + 1].clone()
        )
        for i in range(2)
    ]
    torch.testing.assert_close(ours, torch.cat(rows))


def test_penalty_and_min_p_decide_the_draw_not_the_logprob():
    logits = torch.tensor([[3.0, 2.9, -1.0, 0.5]])
    seen = torch.tensor([[True, False, False, False]])
    params = SamplingParams(max_new_tokens=1, temperature=0.0, repetition_penalty=2.0)
    token, lp = sample_next(logits, params, seen=seen)
    assert token.item() == 1  # 3.0 / 2 < 2.9: the seen token loses the greedy pick
    torch.testing.assert_close(lp, torch.log_softmax(logits, -1)[:, 1])  # under the model's own logits
    with pytest.raises(ValueError, match="tokens each row has seen"):
        sample_next(logits, params)
    only_top = SamplingParams(max_new_tokens=1, temperature=1.0, min_p=1.0)
    draws = {sample_next(logits, only_top, torch.Generator().manual_seed(s))[0].item() for s in range(20)}
    assert draws == {0}
