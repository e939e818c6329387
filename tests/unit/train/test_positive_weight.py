"""``algorithm.positive_weight`` (W-REINFORCE): positive advantages scaled, negative ones kept, in the
advantages a training step learns from."""

from __future__ import annotations

import pytest
import torch
from rollout_batches import groups_batch

from tandem.algos import compute_advantages, weight_positive
from tandem.config.schema import AlgorithmConfig
from tandem.train.experience import ExperienceSettings, make_experience


def test_weight_positive_by_hand():
    adv = torch.tensor([[1.5, 1.5, 0.0], [-0.5, -0.5, 0.0], [0.0, 0.0, 0.0]])  # [B, T]
    want = torch.tensor([[0.15, 0.15, 0.0], [-0.5, -0.5, 0.0], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(weight_positive(adv, 0.1), want)
    torch.testing.assert_close(weight_positive(adv, 0.0), adv.clamp(max=0))  # negative samples only
    assert weight_positive(adv, 1.0) is adv


@pytest.mark.parametrize("weight", [0.0, 0.25])
def test_positive_weight_reaches_the_experience(weight):
    rollout = groups_batch()
    scores = torch.tensor([1.0, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 0])
    kw = {"temperature": 1.0, "autocast_bf16": False, "micro_batch_size": None}
    s = ExperienceSettings.from_config(AlgorithmConfig(name="grpo", positive_weight=weight), **kw)
    exp, metrics = make_experience(rollout, scores, s)
    plain, _ = compute_advantages(
        "grpo", scores=scores, response_mask=exp.rollout.response_mask, group_ids=rollout.group_ids
    )
    torch.testing.assert_close(exp.advantages, torch.where(plain > 0, plain * weight, plain))
    assert bool((plain > 0).any()) and bool((plain < 0).any())  # the batch has both signs to weigh


def test_positive_weight_out_of_range_is_refused():
    with pytest.raises(ValueError, match="positive_weight"):
        AlgorithmConfig(name="grpo", positive_weight=1.5)
