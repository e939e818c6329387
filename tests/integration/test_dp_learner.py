"""A decoupled run with a two-rank data-parallel learner: it trains, the replicas stay identical (the
learner checks a fingerprint of every rank's weights after each step and raises on a difference), the
first update matches a one-rank run, and no rank process outlives the run. PPO trains its critic on every
rank too (a separate value model, and a shared-backbone head through a critic warm-up step)."""

from __future__ import annotations

import multiprocessing as mp
import os
from pathlib import Path

import pytest
import torch
from run_checks import step_rows

from tandem.config import build_config
from tandem.errors import ConfigError
from tandem.orchestration.decoupled.runtime import RunHooks, train_decoupled

DIGITS = f"{Path(__file__).parents[1] / 'e2e' / 'digits_reward.py'}:digit_share"


def _cfg(model_dir, out, world_size, **overrides):
    cfg = {
        "run": {"output_dir": str(out), "seed": 5},
        "model": {"path": str(model_dir)},
        "data": {"task": "arith", "prompts_per_step": 2, "eval_size": 2, "train_size": 16},
        "rollout": {"n": 4, "max_new_tokens": 4},
        "algorithm": {"name": "grpo"},
        "reward": {"task_reward": False, "functions": [{"path": DIGITS}]},
        "trainer": {"total_steps": 2, "lr": 3e-3},
        "architecture": {"mode": "decoupled", "staleness": 0, "learner": {"world_size": world_size}},
        "monitor": {"eval_every": 0, "sample_every": 0, "tensorboard": False, "progress": False},
    }
    for key, value in overrides.items():
        cfg[key] = {**cfg.get(key, {}), **value}
    return build_config(cfg)


def test_two_rank_learner_trains_in_sync_and_cleans_up(tiny_model_dir, tmp_path):
    torch.set_num_threads(1)
    seen: set[int] = set()

    def on_step(run, step):
        seen.update(p.pid for p in mp.active_children() if p.name.startswith("tandem-learner-rank"))

    dp = train_decoupled(_cfg(tiny_model_dir, tmp_path / "dp", 2), progress=False, hooks=RunHooks(on_step))
    assert dp.steps == 2
    assert len(seen) == 1  # one extra rank ran
    for pid in seen:  # joined and gone
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not torch.distributed.is_initialized()
    rows = step_rows(dp.run_dir)
    assert all(r["actor/grad_norm"] > 0 for r in rows)
    # Step 1 trains on a batch sampled from the initial weights in both runs (η = 0), so the update's
    # loss and gradient norm match a single-process learner up to fp32 summation order.
    one = train_decoupled(
        _cfg(tiny_model_dir, tmp_path / "one", 1, trainer={"total_steps": 1}), progress=False
    )
    first = step_rows(one.run_dir)[0]
    assert rows[0]["reward/mean"] == first["reward/mean"]
    for key in ("actor/pg_loss", "actor/grad_norm"):
        assert rows[0][key] == pytest.approx(first[key], rel=1e-5, abs=1e-7), key


def test_two_rank_learner_uses_rank_0s_adaptive_entropy_coefficient(tiny_model_dir, tmp_path):
    """``algorithm.entropy_target``: rank 0 sends each step's coefficient with the batch. The averaged
    gradient keeps the replicas equal whatever each rank used, so the check is against a one-rank learner:
    step 1 (coefficient 0.03, the same batch) has its loss and gradient norm."""
    torch.set_num_threads(1)
    algo = {"name": "grpo", "entropy_target": 100.0, "entropy_coef": 0.03, "entropy_coef_step": 0.02}
    two = train_decoupled(_cfg(tiny_model_dir, tmp_path / "two", 2, algorithm=algo), progress=False)
    rows = step_rows(two.run_dir)
    assert [r["actor/entropy_coef"] for r in rows] == pytest.approx([0.03, 0.05])
    one = train_decoupled(
        _cfg(tiny_model_dir, tmp_path / "one", 1, algorithm=algo, trainer={"total_steps": 1}), progress=False
    )
    first = step_rows(one.run_dir)[0]
    assert rows[0]["reward/mean"] == first["reward/mean"]
    for key in ("actor/loss", "actor/grad_norm"):
        assert rows[0][key] == pytest.approx(first[key], rel=1e-5, abs=1e-7), key


CRITIC_KEYS = ("critic/vf_loss", "critic/vf_clipfrac", "critic/values_mean", "critic/explained_var")


@pytest.mark.parametrize(
    "critic",
    [{"lr": 1e-3}, {"lr": 1e-3, "shared_backbone": True, "warmup_steps": 1}],
    ids=["separate", "shared_head"],
)
def test_two_rank_ppo_trains_its_critic_in_sync(tiny_model_dir, tmp_path, critic):
    torch.set_num_threads(1)
    seen: set[int] = set()

    def on_step(run, step):
        seen.update(p.pid for p in mp.active_children() if p.name.startswith("tandem-learner-rank"))

    cfg = _cfg(
        tiny_model_dir,
        tmp_path / "ppo",
        2,
        algorithm={"name": "ppo", "beta": 0.05},
        trainer={"mini_batch_size": 4, "micro_batch_size": 2},
        critic=critic,
    )
    result = train_decoupled(cfg, progress=False, hooks=RunHooks(on_step))
    assert result.steps == 2  # every step ended with the policy and critic fingerprints equal on both ranks
    assert len(seen) == 1
    for pid in seen:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not torch.distributed.is_initialized()
    rows = step_rows(result.run_dir)
    for r in rows:
        assert all(k in r for k in CRITIC_KEYS), sorted(r)
        assert r["critic/vf_loss"] > 0
    if critic.get("warmup_steps"):  # step 1 trains the head alone, step 2 policy and head together
        assert rows[0]["actor/critic_warmup"] == 1.0 and "actor/pg_loss" not in rows[0]
        assert "actor/critic_warmup" not in rows[1] and rows[1]["actor/grad_norm"] > 0
    else:
        assert all(r["critic/grad_norm"] > 0 and r["actor/grad_norm"] > 0 for r in rows)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"architecture": {"mode": "decoupled", "learner": {"world_size": 9}}}, "exceeds the 8 samples"),
        (
            {"algorithm": {"name": "agro"}, "architecture": {"learner": {"world_size": 3}}},
            "exceeds the 2 groups",
        ),
        (
            {"trainer": {"mini_batch_size": 4}, "architecture": {"learner": {"world_size": 5}}},
            "exceeds the 4",
        ),
    ],
)
def test_bad_world_size_is_a_one_line_config_error(tiny_model_dir, tmp_path, overrides, match):
    with pytest.raises(ConfigError, match="architecture.learner.world_size") as err:
        arch = {"mode": "decoupled", "staleness": 0, **overrides.pop("architecture", {})}
        _cfg(tiny_model_dir, tmp_path, 1, architecture=arch, **overrides)
    assert match in str(err.value)
    assert "\n" not in str(err.value)
