"""``algorithm.std_scope``: the config's choice reaches the advantages a training step learns from."""

from __future__ import annotations

import torch
from rollout_batches import groups_batch

from tandem.algos import compute_advantages
from tandem.config.schema import AlgorithmConfig
from tandem.train.experience import ExperienceSettings, make_experience


def test_batch_std_reaches_the_experience():
    rollout = groups_batch()
    scores = torch.tensor([1.0, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 0])
    kw = {"temperature": 1.0, "autocast_bf16": False, "micro_batch_size": None}
    got = {}
    for scope in ("group", "batch"):
        s = ExperienceSettings.from_config(AlgorithmConfig(name="grpo", std_scope=scope), **kw)
        exp, _ = make_experience(rollout, scores, s)
        expected, _ = compute_advantages(
            "grpo",
            scores=scores,
            response_mask=exp.rollout.response_mask,
            group_ids=rollout.group_ids,
            std_scope=scope,
        )
        torch.testing.assert_close(exp.advantages, expected)
        got[scope] = exp.advantages
    assert not torch.allclose(got["group"], got["batch"])  # the two scopes differ on this batch
