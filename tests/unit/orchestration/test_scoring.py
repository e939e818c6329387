"""score_rollout: what the reward functions of a training step receive."""

from __future__ import annotations

import torch
from rollout_batches import constant_batch

from tandem.orchestration.scoring import score_rollout
from tandem.rewards import RewardFunction, RewardSet


def test_reward_functions_get_each_sample_s_generated_token_ids():
    seen = {}

    def by_tokens(completions, completion_ids, answer, **kwargs):
        seen["ids"], seen["answer"] = completion_ids, answer
        return [float(len(ids)) for ids in completion_ids]

    batch = constant_batch(
        [0, 0, 1],
        response_ids=torch.tensor([[7, 8, 0], [9, 0, 0], [3, 4, 5]]),
        response_mask=torch.tensor([[True, True, False], [True, False, False], [True, True, True]]),
        extras=[{"answer": "a"}, {"answer": "a"}, {"answer": "b"}],
    )
    scores, metrics = score_rollout(batch, RewardSet([RewardFunction("len", by_tokens)]))
    assert seen == {"ids": [[7, 8], [9], [3, 4, 5]], "answer": ["a", "a", "b"]}  # padding left out
    assert scores.tolist() == [2.0, 1.0, 3.0] and metrics["reward/len/mean"] == 2.0
