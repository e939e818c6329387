"""Per-turn rewards in the advantage estimators, on a hand-computed two-turn episode.

Row 0 is an episode of two turns: sampled tokens 0-1 (turn 1), observation tokens 2-3, sampled tokens
4-5 (turn 2). Its step after turn 1 earned 1.0 (on token 1), its last step 2.0 (on token 5); the task
reward is 0.5, so its sequence score is 3.5. Token-level estimators then see rewards 1.0 on token 1 and
2.5 on token 5 (the rest of the score); with ``turn_rewards=None`` all 3.5 on token 5, as before.
"""

from __future__ import annotations

import pytest
import torch

from tandem.algos import ADVANTAGE_ESTIMATORS, compute_advantages

MASK = torch.tensor([[True, True, False, False, True, True]])  # [1, 6]
TURNS = torch.tensor([[0.0, 1.0, 0.0, 0.0, 0.0, 2.0]])  # [1, 6], part of the score 3.5
SCORES = torch.tensor([3.5])


def _adv(name: str, turns: torch.Tensor | None, **kw) -> tuple[torch.Tensor, torch.Tensor]:
    return compute_advantages(
        name, scores=SCORES, response_mask=MASK, group_ids=torch.tensor([0]), turn_rewards=turns, **kw
    )


def test_reinforce_pp_credits_each_turn_with_what_came_after_it() -> None:
    # return-to-go, gamma 0.5: G5 = 2.5, G4 = 1.25, G1 = 1 + 0.5 * 1.25, G0 = 0.5 * G1
    adv, ret = _adv("reinforce_pp", TURNS, gamma=0.5, norm_by_std=False)
    want = torch.tensor([[0.8125, 1.625, 0.0, 0.0, 1.25, 2.5]])
    assert torch.allclose(ret, want)
    assert torch.allclose(adv, (want - want[MASK].mean()) * MASK)
    # the sum: everything at the end, as before
    _, ret = _adv("reinforce_pp", None, gamma=0.5, norm_by_std=False)
    assert torch.allclose(ret, torch.tensor([[0.4375, 0.875, 0.0, 0.0, 1.75, 3.5]]))


def test_gae_credits_each_turn_with_what_came_after_it() -> None:
    values = torch.tensor([[0.5, 0.5, 9.0, 9.0, 1.0, 1.0]])  # observation tokens' values are not used
    # gamma 1, lam 0.5 over tokens 0, 1, 4, 5 (next valid token):
    # d5 = 2.5 - 1 = 1.5          A5 = 1.5
    # d4 = 0 + 1 - 1 = 0          A4 = 0 + 0.5 * 1.5 = 0.75
    # d1 = 1 + 1 - 0.5 = 1.5      A1 = 1.5 + 0.5 * 0.75 = 1.875
    # d0 = 0 + 0.5 - 0.5 = 0      A0 = 0.5 * 1.875 = 0.9375
    adv, ret = _adv("gae", TURNS, values=values, gamma=1.0, lam=0.5, norm_by_std=False)
    assert torch.allclose(adv, torch.tensor([[0.9375, 1.875, 0.0, 0.0, 0.75, 1.5]]))
    assert torch.allclose(ret, torch.tensor([[1.4375, 2.375, 0.0, 0.0, 1.75, 2.5]]))  # A + V
    # the sum: d5 = 3.5 - 1, d1 = 0 + 1 - 0.5
    adv, _ = _adv("gae", None, values=values, gamma=1.0, lam=0.5, norm_by_std=False)
    assert torch.allclose(adv, torch.tensor([[0.5625, 1.125, 0.0, 0.0, 1.25, 2.5]]))


def test_rewards_all_on_the_last_token_are_the_sum() -> None:
    at_end = torch.tensor([[0.0, 0.0, 0.0, 0.0, 0.0, 3.0]])
    values = torch.rand(1, 6)
    for name, kw in (
        ("reinforce_pp", {"gamma": 0.9}),
        ("gae", {"values": values, "gamma": 0.9, "lam": 0.95}),
    ):
        for a, b in zip(_adv(name, at_end, **kw), _adv(name, None, **kw), strict=True):
            assert torch.allclose(a, b), name


def test_reinforce_pp_baseline_subtracts_the_group_mean_from_the_last_token() -> None:
    # row 1: a one-turn episode of the same group, score 1.5 (tokens 0-1). Group mean 2.5: row 0 keeps
    # 1.0 on token 1 and 3.5 - 2.5 - 3.0 = -2.0 + 2.0 = 0 on token 5; row 1 has -1.0 on token 1.
    mask = torch.cat([MASK, torch.tensor([[True, True, False, False, False, False]])])
    turns = torch.cat([TURNS, torch.zeros(1, 6)])
    adv, ret = compute_advantages(
        "reinforce_pp_baseline",
        scores=torch.tensor([3.5, 1.5]),
        response_mask=mask,
        group_ids=torch.tensor([0, 0]),
        turn_rewards=turns,
        gamma=1.0,
        norm_by_std=False,
    )
    want = torch.tensor([[1.0, 1.0, 0.0, 0.0, 0.0, 0.0], [-1.0, -1.0, 0.0, 0.0, 0.0, 0.0]])
    assert torch.allclose(ret, want)
    assert torch.allclose(adv, want)  # the mean return over valid tokens is 0


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "remax", "opd"])
def test_estimators_without_token_rewards_ignore_turn_rewards(name: str) -> None:
    g = torch.Generator().manual_seed(0)
    mask = torch.rand(4, 6, generator=g) > 0.3
    kw = {
        "scores": torch.tensor([3.5, 1.0, 0.0, 2.0]),
        "response_mask": mask,
        "group_ids": torch.tensor([0, 0, 1, 1]),
        "baseline_scores": torch.tensor([1.0, 1.0, 0.5, 0.5]),
        "logprobs": -torch.rand(4, 6, generator=g),
        "teacher_logprobs": -torch.rand(4, 6, generator=g),
        "reward_weight": 0.5,
    }
    assert not ADVANTAGE_ESTIMATORS.get(name).uses_token_rewards
    turns = torch.rand(4, 6, generator=g)
    for a, b in zip(
        compute_advantages(name, turn_rewards=turns, **kw), compute_advantages(name, **kw), strict=True
    ):
        assert torch.equal(a, b), name


def test_turn_rewards_shape_is_checked() -> None:
    with pytest.raises(ValueError, match=r"turn_rewards must have shape \(1, 6\)"):
        _adv("reinforce_pp", torch.zeros(1, 5))


def test_the_learner_credits_the_batchs_turn_rewards() -> None:
    from tandem.train.experience import ExperienceSettings, make_experience
    from tandem.types import RolloutBatch

    batch = RolloutBatch(
        prompt_ids=torch.ones(1, 2, dtype=torch.long),
        prompt_mask=torch.ones(1, 2, dtype=torch.bool),
        response_ids=torch.ones(1, 6, dtype=torch.long),
        response_mask=MASK,
        behavior_logprobs=-0.5 * MASK.float(),
        group_ids=torch.tensor([0]),
        policy_version=torch.tensor([0]),
        prompts=["p"],
        completions=["c"],
        finish_reasons=["stop"],
        turn_rewards=TURNS,
    )
    s = ExperienceSettings("reinforce_pp", 0.5, 1.0, False, 0.0, "k1", False, 1.0, False, None)
    exp, _ = make_experience(batch, SCORES, s)
    assert torch.allclose(exp.returns, torch.tensor([[0.8125, 1.625, 0.0, 0.0, 1.25, 2.5]]))
