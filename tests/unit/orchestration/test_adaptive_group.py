"""Adaptive group size (``algorithm.adaptive_group``): all-equal groups grow with samples of their own prompt
until a reward differs or ``max_n``; ragged groups through every group-relative estimator equal a
brute-force computation; the trainer learns from the grown batch; the config rejects what cannot work."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
import torch
from rollout_batches import constant_batch

from tandem.algos import ADVANTAGE_ESTIMATORS, compute_advantages
from tandem.config import build_config
from tandem.errors import ConfigError
from tandem.orchestration.adaptive_group import eligible_groups, grow_groups
from tandem.orchestration.colocated import ColocatedTrainer
from tandem.orchestration.parts import build_parts
from tandem.orchestration.rollout_step import SequentialPrompts
from tandem.rollout.rows import per_prompt
from tandem.types import RolloutBatch

DIGITS = Path(__file__).parents[2] / "e2e" / "digits_reward.py"


def rows(gids: list[int], scores: list[float]) -> tuple[RolloutBatch, torch.Tensor]:
    """A batch with one row per entry of ``gids`` (the score goes in the completion, for checking)."""
    return constant_batch(gids, [str(s) for s in scores]), torch.tensor(scores, dtype=torch.float32)


class Scripted:
    """``more``: group ``g``'s samples score 0 until its total size passes ``success_at[g]`` (missing: never),
    then 1 (all-pass groups: 1 until then, 0 after). Records every request."""

    def __init__(self, success_at: dict[int, int], sizes: dict[int, int], base: dict[int, float]):
        self.success_at, self.sizes, self.base = success_at, dict(sizes), base
        self.asks: list[list[tuple[int, int]]] = []

    def __call__(self, asks: list[tuple[int, int]], round_: int) -> tuple[RolloutBatch, torch.Tensor]:
        self.asks.append(list(asks))
        gids, scores = [], []
        for g, k in asks:
            for _ in range(k):
                self.sizes[g] += 1
                flip = self.sizes[g] > self.success_at.get(g, math.inf)
                gids.append(g)
                scores.append(1.0 - self.base[g] if flip else self.base[g])
        return rows(gids, scores)


def test_group_grows_until_a_success_appears_and_stops_at_max_n() -> None:
    # groups (n = 4): 10 all-fail, success on its 7th sample; 11 all-fail, never; 12 mixed; 13 all-pass
    first = rows([10] * 4 + [11] * 4 + [12] * 4 + [13] * 4, [0.0] * 8 + [0.0, 1.0, 0.0, 0.0] + [1.0] * 4)
    more = Scripted({10: 6}, {10: 4, 11: 4, 12: 4, 13: 4}, {10: 0.0, 11: 0.0, 13: 1.0})
    batch, scores, m = grow_groups(first, more, max_n=13, per_round=3, which="all_fail", pad_token_id=0)
    sizes = {g: int((batch.group_ids == g).sum()) for g in (10, 11, 12, 13)}
    assert sizes == {10: 7, 11: 13, 12: 4, 13: 4}  # 10 rescued in round 1; 11 capped: 4 + 3 + 3 + 3 = 13
    assert more.asks == [[(10, 3), (11, 3)], [(11, 3)], [(11, 3)]]
    assert (
        float(scores[batch.group_ids == 10].max()) == 1.0
        and float(scores[batch.group_ids == 11].max()) == 0.0
    )
    assert batch.group_ids.tolist() == sorted(batch.group_ids.tolist())  # each group's rows together
    assert m["adaptive/extra_samples"] == 12 and m["adaptive/rounds"] == 3
    assert m["adaptive/extended_frac"] == 0.5 and m["adaptive/rescued_frac"] == 0.5
    assert m["adaptive/all_equal_frac"] == 0.5 and m["adaptive/group_size_max"] == 13  # 11 and 13 still equal


def test_the_last_round_fills_up_to_max_n_exactly() -> None:
    first = rows([0] * 4, [0.0] * 4)
    more = Scripted({}, {0: 4}, {0: 0.0})
    batch, _, m = grow_groups(first, more, max_n=9, per_round=3, which="all_fail", pad_token_id=0)
    assert more.asks == [[(0, 3)], [(0, 2)]] and batch.batch_size == 9
    assert m["adaptive/rescued_frac"] == 0.0 and m["adaptive/extended_frac"] == 1.0


def test_which_groups_are_extended() -> None:
    mean = torch.tensor([0.0, 1.0, 0.5, -1.0])
    equal = torch.tensor([True, True, False, True])
    assert eligible_groups(mean, equal, "all_fail").tolist() == [True, False, False, True]
    assert eligible_groups(mean, equal, "all_pass").tolist() == [False, True, False, False]
    assert eligible_groups(mean, equal, "all_equal").tolist() == [True, True, False, True]
    first = rows([0] * 2 + [1] * 2, [1.0, 1.0, 0.0, 1.0])
    more = Scripted({0: 3}, {0: 2, 1: 2}, {0: 1.0})
    batch, scores, m = grow_groups(first, more, max_n=8, per_round=2, which="all_pass", pad_token_id=0)
    assert more.asks == [[(0, 2)]] and scores[batch.group_ids == 0].tolist() == [1.0, 1.0, 1.0, 0.0]
    assert m["adaptive/rescued_frac"] == 1.0


def test_nothing_to_extend_returns_the_batch_unchanged() -> None:
    first = rows([0, 0, 1, 1], [0.0, 1.0, 1.0, 0.0])
    batch, scores, m = grow_groups(
        first, Scripted({}, {}, {}), max_n=8, per_round=2, which="all_fail", pad_token_id=0
    )
    assert batch.batch_size == 4 and scores.tolist() == [0.0, 1.0, 1.0, 0.0]
    assert (
        m["adaptive/extra_samples"] == 0 and m["adaptive/rounds"] == 0 and m["adaptive/rescued_frac"] == 0.0
    )


# --- ragged groups through the estimators, against per-group loops written out here ------------------


def _brute(name: str, scores: list[float], gids: list[int], k: int = 2) -> list[float]:
    """Per-sample advantage of a 1-token response, group by group, straight from the definitions."""
    eps, out = 1e-6, []
    for i, (r, g) in enumerate(zip(scores, gids, strict=True)):
        grp = [s for s, h in zip(scores, gids, strict=True) if h == g]
        n, mean = len(grp), sum(grp) / len(grp)
        std = math.sqrt(sum((s - mean) ** 2 for s in grp) / (n - 1)) if n > 1 else 0.0
        if name == "grpo":
            out.append((r - mean) / (std + eps))
        elif name == "dr_grpo":
            out.append(r - mean)
        elif name == "rloo":
            others = [s for j, (s, h) in enumerate(zip(scores, gids, strict=True)) if h == g and j != i]
            out.append(r - sum(others) / len(others))
        elif name == "passk":  # enumerate every k-subset of the group that holds this sample
            idx = [j for j, h in enumerate(gids) if h == g]
            kk = min(k, n)
            subsets = list(itertools.combinations(idx, kk))
            rate = sum(any(scores[j] > 0.5 for j in s) for s in subsets) / len(subsets)
            sigma = math.sqrt(rate * (1 - rate)) + eps
            mine = [any(scores[j] > 0.5 for j in s) for s in subsets if i in s]
            out.append(0.0 if rate in (0.0, 1.0) else (sum(mine) / len(mine) - rate) / sigma)
        else:
            raise AssertionError(name)
    return out


# Ragged, interleaved groups (sizes 8, 3, 13, 2) with successes here and there, as growth leaves them.
GIDS = [7] * 8 + [2] * 3 + [9] * 13 + [4] * 2
SCORES = [0.0] * 7 + [1.0] + [1.0, 0.0, 1.0] + [0.0] * 11 + [1.0, 0.0] + [0.0, 1.0]
PERM = torch.randperm(len(GIDS), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "passk"])
def test_ragged_group_advantages_equal_brute_force(name: str) -> None:
    gids = [GIDS[i] for i in PERM]
    scores = [SCORES[i] for i in PERM]
    for k in (1, 2, 3) if name == "passk" else (2,):
        adv, _ = compute_advantages(
            name,
            scores=torch.tensor(scores),
            response_mask=torch.ones(len(gids), 1, dtype=torch.bool),
            group_ids=torch.tensor(gids),
            norm_by_std=name != "dr_grpo",
            pass_k=k,
        )
        assert adv[:, 0].tolist() == pytest.approx(_brute(name, scores, gids, k), abs=1e-5)


def test_ragged_baseline_reinforce_subtracts_each_groups_own_mean() -> None:
    mask = torch.tensor([[True, True]] * len(GIDS))
    means = {
        g: sum(s for s, h in zip(SCORES, GIDS, strict=True) if h == g) / GIDS.count(g) for g in set(GIDS)
    }
    centred = torch.tensor([s - means[g] for s, g in zip(SCORES, GIDS, strict=True)])
    got, _ = compute_advantages(
        "reinforce_pp_baseline", scores=torch.tensor(SCORES), response_mask=mask, group_ids=torch.tensor(GIDS)
    )
    want, _ = compute_advantages(
        "reinforce_pp", scores=centred, response_mask=mask, group_ids=torch.tensor(GIDS)
    )
    assert torch.allclose(got, want, atol=1e-6)


def test_every_group_relative_estimator_is_checked_on_ragged_groups() -> None:
    # The config allows adaptive group size with exactly the group-relative estimators; each must be
    # verified above (a new one needs its brute-force case here).
    relative = {n for n in ADVANTAGE_ESTIMATORS if ADVANTAGE_ESTIMATORS[n].group_relative}
    assert relative == {"grpo", "dr_grpo", "rloo", "passk", "reinforce_pp_baseline"}


# --- through the colocated trainer -----------------------------------------------------------------


class PromptEngine:
    """Fake engine (unit test only): a prompt's samples answer ``"12"`` (reward 1) from the call number
    in ``success_from[prompt]`` on (missing: never), ``"ab"`` (reward 0) before. Takes one
    ``SamplingParams`` or one per prompt, as the real engines do; records each call's (prompt, n)."""

    def __init__(self, success_from: dict[str, int]):
        self.success_from, self.version, self.calls = success_from, 0, []

    def update_weights(self, state_dict, version):
        self.version = version

    def generate(self, prompts, params, *, group_offset=0, extras=None, on_chunk=None, chunk_tokens=4):
        ns = [p.n for p in per_prompt(params, len(prompts))]
        call = len(self.calls)
        self.calls.append(list(zip(prompts, ns, strict=True)))
        B = sum(ns)
        good = [call >= self.success_from.get(p, math.inf) for p in prompts]
        return RolloutBatch(
            prompt_ids=torch.full((B, 3), 5),
            prompt_mask=torch.ones(B, 3, dtype=torch.bool),
            response_ids=torch.full((B, 2), 6),
            response_mask=torch.ones(B, 2, dtype=torch.bool),
            behavior_logprobs=torch.full((B, 2), -1.0),
            group_ids=torch.arange(len(prompts)).repeat_interleave(torch.tensor(ns)) + group_offset,
            policy_version=torch.full((B,), self.version),
            prompts=[p for p, n in zip(prompts, ns, strict=True) for _ in range(n)],
            completions=[("12" if ok else "ab") for ok, n in zip(good, ns, strict=True) for _ in range(n)],
            finish_reasons=["stop"] * B,
            extras=[e for e, n in zip(extras or [{}] * len(prompts), ns, strict=True) for _ in range(n)],
        )


def _cfg(tmp_path, tiny_model_dir, algo=None, **sections):
    base = {
        "run": {"output_dir": str(tmp_path)},
        "model": {"path": str(tiny_model_dir)},
        "data": {"task": "arith", "prompts_per_step": 2, "eval_size": 0, "train_size": 32},
        "rollout": {"n": 2, "max_new_tokens": 2},
        "algorithm": {"name": "grpo", "adaptive_group": {"enabled": True, "max_n": 6}, **(algo or {})},
        "reward": {"task_reward": False, "functions": [{"path": f"{DIGITS}:digit_share"}]},
    }
    for key, value in sections.items():
        base[key] = {**base.get(key, {}), **value}
    return build_config(base)


def test_trainer_grows_the_all_fail_group_and_learns_from_the_ragged_batch(tiny_model_dir, tmp_path):
    cfg = _cfg(tmp_path, tiny_model_dir)
    parts = build_parts(cfg)
    first = SequentialPrompts(parts.data.train, 2, cfg.run.seed).rows(0, 0)  # what step 0 will draw
    hard, easy = first[0]["prompt"], first[1]["prompt"]
    engine = PromptEngine({hard: 2, easy: 0})  # easy: solved at once; hard: from the third call on
    parts.engine = engine
    trainer = ColocatedTrainer(parts)
    metrics = trainer.train_step()
    # call 0: both prompts, 2 samples each (all solved -> all-equal but all-pass: not extended);
    # hard is all-fail and grows by 2 per round; call 2 brings its first success.
    assert engine.calls == [[(hard, 2), (easy, 2)], [(hard, 2)], [(hard, 2)]]
    assert metrics["adaptive/extra_samples"] == 4 and metrics["adaptive/rescued_frac"] == 1.0
    assert metrics["groups/all_equal_frac"] == 1.0  # measured on the first round
    assert metrics["adaptive/all_equal_frac"] == 0.5 and "actor/pg_loss" in metrics


def test_config_rejects_what_cannot_take_ragged_groups(tiny_model_dir, tmp_path):
    ok = _cfg(tmp_path, tiny_model_dir)
    assert ok.algorithm.adaptive_group.enabled and ok.algorithm.adaptive_group.which == "all_fail"
    assert not build_config(
        {"run": {}, "model": {"path": "m"}, "data": {"task": "arith"}}
    ).algorithm.adaptive_group.enabled
    assert _cfg(tmp_path, tiny_model_dir, architecture={"mode": "decoupled"}).algorithm.adaptive_group.enabled
    key = r"algorithm\.adaptive_group\.enabled"
    cases = [
        ({"name": "reinforce_pp"}, {}, rf"{key}.*group-relative advantage.*not 'reinforce_pp'"),
        ({"name": "dapo"}, {}, rf"{key}.*dynamic_sampling"),
        ({}, {"trainer": {"mini_batch_size": 2}}, rf"{key}.*mini_batch_size"),
        (
            {"adaptive_group": {"enabled": True, "max_n": 2}},
            {},
            r"algorithm\.adaptive_group\.max_n.*rollout\.n=2",
        ),
    ]
    for algo, sections, match in cases:
        with pytest.raises(ConfigError, match=match):
            _cfg(tmp_path, tiny_model_dir, algo, **sections)
