"""``algorithm.mask_truncated``: truncated samples (finish reason "length") leave the loss and its token
counts after their scores served the group baseline — the update equals one on the batch without them."""

from __future__ import annotations

import pytest
import torch
from grad_capture import update_grads
from rollout_batches import sampled_batch

from tandem.config.schema import AlgorithmConfig
from tandem.train.experience import ExperienceSettings, make_experience, without_truncated
from tandem.types import RolloutBatch

CUT = [1, 4, 5, 10]  # rows cut off at max_new_tokens


def _rollout(B=12, n=4, P=3, R=5, seed=0) -> tuple[RolloutBatch, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, R, (B,), generator=g)
    lengths[CUT] = R  # a truncated row used every token it was allowed
    prompts = torch.randint(4, 40, (B // n, P), generator=g).repeat_interleave(n, dim=0)
    reasons = ["length" if i in CUT else "stop" for i in range(B)]
    rollout = sampled_batch(prompts, torch.ones(B, P, dtype=torch.bool), lengths, R, n, g, reasons)
    return rollout, torch.randint(0, 2, (B,), generator=g).float()


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "dapo"])
def test_masked_update_equals_the_update_without_the_truncated_rows(tiny_model_dir, name):
    rollout, scores = _rollout()
    masked_algo = AlgorithmConfig(name=name, mask_truncated=True)
    plain_algo = AlgorithmConfig(name=name)
    kw = {"temperature": 1.0, "autocast_bf16": False, "micro_batch_size": None}
    masked, metrics = make_experience(rollout, scores, ExperienceSettings.from_config(masked_algo, **kw))
    plain, _ = make_experience(rollout, scores, ExperienceSettings.from_config(plain_algo, **kw))
    assert metrics["actor/truncated_masked_frac"] == pytest.approx(len(CUT) / 12)
    kept = [i for i in range(12) if i not in CUT]
    assert torch.equal(masked.advantages[kept], plain.advantages[kept])  # the baseline still counts them
    assert not masked.rollout.response_mask[CUT].any() and not masked.advantages[CUT].any()
    g_masked, m_masked = update_grads(tiny_model_dir, masked, masked_algo)
    g_kept, m_kept = update_grads(tiny_model_dir, plain.select(kept), plain_algo)
    g_all, _ = update_grads(tiny_model_dir, plain, plain_algo)
    for key, g in g_kept.items():
        torch.testing.assert_close(g_masked[key], g, rtol=1e-5, atol=1e-7)
    assert any(not torch.allclose(g_all[k], g, rtol=1e-3, atol=1e-6) for k, g in g_kept.items())
    assert m_masked["actor/pg_loss"] == pytest.approx(m_kept["actor/pg_loss"], rel=1e-5, abs=1e-7)


def test_nothing_truncated_leaves_the_experience_as_it_was():
    rollout, scores = _rollout()
    rollout.finish_reasons[:] = ["stop"] * 12
    s = ExperienceSettings.from_config(
        AlgorithmConfig(name="grpo"), temperature=1.0, autocast_bf16=False, micro_batch_size=None
    )
    exp, _ = make_experience(rollout, scores, s)
    same, frac = without_truncated(exp)
    assert same is exp and frac == 0.0
