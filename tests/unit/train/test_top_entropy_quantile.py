"""``algorithm.top_entropy_quantile``: the policy gradient on the top-ρ tokens by entropy only ("Beyond the
80/20 Rule"): the mask's arithmetic, the update it gives, and the losses it refuses."""

from __future__ import annotations

import pytest
import torch
from grad_capture import update_grads
from rollout_batches import sampled_batch

from tandem.algos import high_entropy_mask
from tandem.config.schema import AlgorithmConfig
from tandem.models import load_causal_lm
from tandem.models.forward import response_logprobs
from tandem.types import Experience


def test_high_entropy_mask_keeps_the_top_fraction_of_valid_tokens():
    entropy = torch.tensor([[0.1, 0.9, 5.0], [0.5, 0.7, 0.3], [0.2, 0.8, 0.4]])
    mask = torch.tensor([[True, True, False], [True, True, True], [True, True, True]])  # the 5.0 is padding
    top = high_entropy_mask(
        entropy, mask, 0.25
    )  # 8 valid tokens: 0.8 and 0.9 (the 1 - 0.25 quantile is 0.725)
    assert top.tolist() == [[False, True, False], [False, False, False], [False, True, False]]
    assert torch.equal(high_entropy_mask(entropy, mask, 1.0), mask)
    ties = high_entropy_mask(torch.ones(2, 3), torch.ones(2, 3, dtype=torch.bool), 0.2)
    assert bool(ties.all())  # equal entropies: none is below the threshold
    empty = torch.zeros(2, 3, dtype=torch.bool)
    assert not high_entropy_mask(entropy[:2], empty, 0.2).any()
    with pytest.raises(ValueError, match="quantile must be in"):
        high_entropy_mask(entropy, mask, 0.0)


def _experience(B=8, n=4, P=3, R=5, seed=0) -> Experience:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, R + 1, (B,), generator=g)
    prompts = torch.randint(4, 40, (B // n, P), generator=g).repeat_interleave(n, dim=0)
    rollout = sampled_batch(prompts, torch.ones(B, P, dtype=torch.bool), lengths, R, n, g)
    adv = torch.randn(B, generator=g)[:, None].expand(B, R) * rollout.response_mask
    return Experience(
        rollout=rollout, scores=adv[:, 0].clone(), old_logprobs=None, advantages=adv, returns=adv
    )


def _grads(model_dir, exp, quantile):
    algo = AlgorithmConfig(name="grpo", top_entropy_quantile=quantile)
    return update_grads(model_dir, exp, algo, skip_zero_advantage=False)


def test_update_equals_the_full_update_with_low_entropy_advantages_zeroed(tiny_model_dir):
    exp = _experience()
    r = exp.rollout
    with torch.no_grad():
        _, entropy = response_logprobs(
            load_causal_lm(tiny_model_dir),
            r.prompt_ids,
            r.prompt_mask,
            r.response_ids,
            r.response_mask,
            with_entropy=True,
        )
    forking = high_entropy_mask(entropy, r.response_mask, 0.2)
    assert 0 < int(forking.sum()) < int(r.response_mask.sum())
    zeroed = Experience(
        rollout=r,
        scores=exp.scores,
        old_logprobs=None,
        advantages=exp.advantages * forking,
        returns=exp.returns,
    )
    g_top, metrics = _grads(tiny_model_dir, exp, 0.2)
    g_zeroed, plain = _grads(tiny_model_dir, zeroed, 1.0)
    g_all, _ = _grads(tiny_model_dir, exp, 1.0)
    for key, g in g_zeroed.items():
        torch.testing.assert_close(g_top[key], g, rtol=1e-4, atol=1e-6)
    assert any(not torch.allclose(g_all[k], g, rtol=1e-3, atol=1e-6) for k, g in g_zeroed.items())
    assert metrics["actor/entropy_kept_frac"] == pytest.approx(float(forking.sum() / r.response_mask.sum()))
    assert "actor/entropy_kept_frac" not in plain


def test_a_loss_that_reads_rewards_itself_is_refused():
    from tandem.config import TandemConfig

    base = {"model": {"path": "m"}, "data": {"task": "arith"}}
    TandemConfig.model_validate({**base, "algorithm": {"name": "grpo", "top_entropy_quantile": 0.2}})
    with pytest.raises(ValueError, match="policy loss 'agro' is not a multiple of the advantage"):
        TandemConfig.model_validate({**base, "algorithm": {"name": "agro", "top_entropy_quantile": 0.2}})
    with pytest.raises(ValueError):
        TandemConfig.model_validate({**base, "algorithm": {"top_entropy_quantile": 0.0}})
