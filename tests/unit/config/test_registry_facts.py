"""The config checks read an algorithm piece's facts from its registry entry, never from name lists: an
estimator or loss registered here, in the test, is checked like a built-in one."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tandem.algos import ADVANTAGE_ESTIMATORS, CORRECTIONS, KL_ESTIMATORS, POLICY_LOSSES
from tandem.config import build_config
from tandem.errors import ConfigError


@contextmanager
def _registered(registry, name: str, item) -> Iterator[None]:
    registry.add(name, item)
    try:
        yield
    finally:
        registry.unregister(name)


def _data(algorithm: dict, n: int = 4, **arch) -> dict:
    return {
        "model": {"path": "unused"},
        "data": {"task": "arith", "prompts_per_step": 2},
        "rollout": {"n": n},
        "algorithm": {"name": "custom", "policy_loss": "ppo_clip", "aggregation": "token-mean", **algorithm},
        "architecture": arch,
    }


def test_builtin_facts():
    assert [n for n in ADVANTAGE_ESTIMATORS if ADVANTAGE_ESTIMATORS[n].group_relative] == [
        "grpo",
        "dr_grpo",
        "rloo",
        "reinforce_pp_baseline",
        "passk",
    ]
    token = [n for n in ADVANTAGE_ESTIMATORS if ADVANTAGE_ESTIMATORS[n].uses_token_rewards]
    assert token == ["gae", "reinforce_pp", "reinforce_pp_baseline"]
    assert [n for n in POLICY_LOSSES if POLICY_LOSSES[n].off_policy_safe] == ["decoupled_ppo", "topr", "agro"]


def test_batch_std_is_a_registry_fact_and_needs_a_std():
    assert [n for n in ADVANTAGE_ESTIMATORS if ADVANTAGE_ESTIMATORS[n].batch_std] == ["grpo"]
    batch = {"advantage": "grpo", "norm_by_std": True, "std_scope": "batch"}
    assert build_config(_data(batch)).algorithm.std_scope == "batch"
    with pytest.raises(
        ConfigError, match=r"algorithm.std_scope: advantage 'rloo' has no batch std; batch works with grpo"
    ):
        build_config(_data({**batch, "advantage": "rloo"}))
    with pytest.raises(
        ConfigError, match=r"algorithm.std_scope: batch scales by a std, but algorithm.norm_by_std"
    ):
        build_config(_data({**batch, "norm_by_std": False}))
    spec = dataclasses.replace(ADVANTAGE_ESTIMATORS["rloo"], batch_std=True)
    with _registered(ADVANTAGE_ESTIMATORS, "test_batch_std", spec):
        assert build_config(_data({**batch, "advantage": "test_batch_std"})).algorithm.std_scope == "batch"


def test_group_relative_estimator_registered_in_a_test_needs_two_samples():
    spec = dataclasses.replace(ADVANTAGE_ESTIMATORS["dr_grpo"], group_relative=True)
    with _registered(ADVANTAGE_ESTIMATORS, "test_grouped", spec):
        with pytest.raises(ConfigError, match=r"rollout.n: advantage 'test_grouped' is group-relative"):
            build_config(_data({"advantage": "test_grouped"}, n=1))
        assert build_config(_data({"advantage": "test_grouped"}, n=2)).algorithm.advantage == "test_grouped"
    plain = dataclasses.replace(spec, group_relative=False)
    with _registered(ADVANTAGE_ESTIMATORS, "test_plain", plain):
        assert build_config(_data({"advantage": "test_plain"}, n=1)).rollout.n == 1


def test_kl_in_the_reward_follows_uses_token_rewards():
    kl = {"beta": 0.1, "kl": {"where": "reward"}}
    spec = dataclasses.replace(ADVANTAGE_ESTIMATORS["grpo"], uses_token_rewards=True)
    with _registered(ADVANTAGE_ESTIMATORS, "test_token", spec):
        assert build_config(_data({"advantage": "test_token", **kl})).algorithm.kl.where == "reward"
        with pytest.raises(ConfigError, match=r"algorithm.kl.where: .*test_token.*not 'grpo'"):
            build_config(_data({"advantage": "grpo", **kl}))


def test_estimator_needing_an_input_the_trainer_lacks_lists_the_usable_ones():
    spec = dataclasses.replace(ADVANTAGE_ESTIMATORS["grpo"], requires=("turn_rewards",))
    needs = "algorithm.advantage: 'test_turns' needs turn_rewards"
    with (
        _registered(ADVANTAGE_ESTIMATORS, "test_turns", spec),
        pytest.raises(ConfigError, match=needs) as err,
    ):
        build_config(_data({"advantage": "test_turns"}))
    assert "use gae, grpo, dr_grpo, rloo, reinforce_pp, reinforce_pp_baseline" in str(err.value)


def test_remax_asks_for_the_greedy_rows_that_provide_its_baseline():
    with pytest.raises(ConfigError, match=r"algorithm.advantage: 'remax' .*rollout\.greedy_in_group=true"):
        build_config(_data({"advantage": "remax"}))
    data = _data({"advantage": "remax"})
    data.setdefault("rollout", {})["greedy_in_group"] = True
    assert build_config(data).rollout.group_size == 5  # n = 4 samples and the greedy answer


def test_off_policy_safe_loss_registered_in_a_test_silences_the_staleness_warning(caplog):
    spec = dataclasses.replace(POLICY_LOSSES["ppo_clip"], off_policy_safe=True)
    arch = {"mode": "decoupled", "staleness": 3}
    with _registered(POLICY_LOSSES, "test_safe", spec), caplog.at_level(logging.WARNING, "tandem.config"):
        build_config(_data({"advantage": "grpo", "policy_loss": "test_safe"}, **arch))
        assert not caplog.records
        build_config(_data({"advantage": "grpo"}, **arch))
        assert "safe choices: algorithm.policy_loss=decoupled_ppo, topr, agro, test_safe" in caplog.text


@pytest.mark.parametrize(
    ("algorithm", "key", "registry"),
    [
        ({"correction": "token_ti"}, "algorithm.correction", CORRECTIONS),
        ({"kl": {"kind": "k4"}}, "algorithm.kl.kind", KL_ESTIMATORS),
    ],
)
def test_unknown_registry_names_list_the_valid_ones(algorithm, key, registry):
    with pytest.raises(ConfigError, match=f"{key}: unknown name") as err:
        build_config(_data({"advantage": "grpo", **algorithm}))
    assert ", ".join(registry.names()) in str(err.value)


def test_every_registered_correction_and_kl_estimator_is_accepted():
    for name in CORRECTIONS:
        assert build_config(_data({"advantage": "grpo", "correction": name})).algorithm.correction == name
    for name in KL_ESTIMATORS:
        cfg = build_config(_data({"advantage": "grpo", "kl": {"kind": name}}))
        assert cfg.algorithm.kl.kind == name
