"""End to end: every algorithm preset trains a few steps; resume is exact; GRPO learns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import safetensors.torch
import torch

from tandem.config import build_config
from tandem.models import load_causal_lm
from tandem.orchestration.runner import train
from tandem.train.checkpoint import LIVE_WEIGHTS, latest_checkpoint

HERE = Path(__file__).parent


def _cfg(tiny_model_dir, out, algo="grpo", **sections):
    data = {
        "run": {"output_dir": str(out), "seed": 3},
        "model": {"path": str(tiny_model_dir)},
        "data": {"task": "arith", "prompts_per_step": 2, "eval_size": 4, "train_size": 64},
        "rollout": {"n": 4, "max_new_tokens": 4},
        "algorithm": {"name": algo},
        "trainer": {"total_steps": 2, "lr": 1e-3},
        "monitor": {"eval_every": 0, "sample_every": 1, "tensorboard": False, "progress": False},
    }
    for key, value in sections.items():
        data.setdefault(key, {}).update(value)
    return build_config(data)


def _weights(path):
    return {k: v.clone() for k, v in load_causal_lm(path).state_dict().items()}


@pytest.mark.parametrize(
    ("algo", "extra"),
    [
        ("grpo", {}),
        ("dr_grpo", {}),
        ("dapo", {"reward": {"overlong": {"enabled": True, "max_len": 4, "buffer": 2}}}),
        ("rloo", {}),
        ("reinforce_pp", {}),
        ("grpo", {"algorithm": {"name": "grpo", "beta": 0.05}}),
        ("reinforce_pp", {"algorithm": {"name": "reinforce_pp", "beta": 0.05, "kl": {"where": "reward"}}}),
        ("grpo", {"trainer": {"ppo_epochs": 2, "mini_batch_size": 4, "micro_batch_size": 2}}),
        ("grpo", {"algorithm": {"name": "grpo", "entropy_coef": 0.01}}),
    ],
)
def test_every_algorithm_trains(tiny_model_dir, tmp_path, algo, extra):
    # A digit-share reward gives every group some spread, so updates are non-trivial.
    reward = {"task_reward": False, "functions": [{"path": f"{HERE / 'digits_reward.py'}:digit_share"}]}
    merged_reward = {**reward, **extra.pop("reward", {})}
    cfg = _cfg(tiny_model_dir, tmp_path / "run", algo, reward=merged_reward, **extra)
    before = _weights(tiny_model_dir)
    result = train(cfg, progress=False)
    assert result.steps == 2
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if r["step"] >= 1]
    assert all(r["actor/pg_loss"] is not None for r in train_rows)
    ckpt = latest_checkpoint(result.run_dir / "checkpoints")
    assert ckpt is not None
    after = _weights(ckpt / "model")
    assert any(not torch.equal(before[k], after[k]) for k in before), "weights did not change"
    assert (result.run_dir / "summary.json").exists()
    assert (result.run_dir / "config.yaml").exists()


@pytest.mark.parametrize("ema_decay", [0.0, 0.6], ids=["live", "weight-average"])
def test_resume_is_exact(tiny_model_dir, tmp_path, crash_at_step, ema_decay):
    common = {
        "trainer": {"total_steps": 4, "lr": 1e-3, "ema_decay": ema_decay},
        "checkpoint": {"every": 2, "keep_last": 5},
        # every group has some spread, so the weights move (and the average lags them)
        "reward": {"task_reward": False, "functions": [{"path": f"{HERE / 'digits_reward.py'}:digit_share"}]},
    }
    full = train(_cfg(tiny_model_dir, tmp_path / "full", **common), progress=False)

    # Same run, killed after the step-2 checkpoint, then resumed from it.
    crash_at_step(_cfg(tiny_model_dir, tmp_path / "part", **common), 2)
    assert not (tmp_path / "part" / "summary.json").exists()
    resumed = train(_cfg(tiny_model_dir, tmp_path / "part", **common), resume=True, progress=False)

    assert resumed.steps == 4
    w_full = _weights(latest_checkpoint(full.run_dir / "checkpoints") / "model")
    w_res = _weights(latest_checkpoint(resumed.run_dir / "checkpoints") / "model")
    for k in w_full:
        torch.testing.assert_close(w_res[k], w_full[k], rtol=0, atol=0)
    live_file = latest_checkpoint(full.run_dir / "checkpoints") / LIVE_WEIGHTS
    if ema_decay:  # model/ is the average; the live weights beside it, also resumed exactly
        live_full = safetensors.torch.load_file(live_file)
        live_res = safetensors.torch.load_file(
            latest_checkpoint(resumed.run_dir / "checkpoints") / LIVE_WEIGHTS
        )
        assert live_full.keys() == live_res.keys() and live_full
        for k in live_full:
            torch.testing.assert_close(live_res[k], live_full[k], rtol=0, atol=0)
        assert any(not torch.equal(live_full[k], w_full[k]) for k in live_full)  # it lags the live weights
    else:
        assert not live_file.exists()

    def rewards(run):
        rows = [json.loads(x) for x in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
        return [(r["step"], r.get("reward/mean"), r.get("actor/pg_loss")) for r in rows if r["step"] >= 1]

    assert rewards(resumed) == rewards(full)


def test_grpo_learns_a_trivial_reward(tiny_model_dir, tmp_path):
    """Small budget: the share of digits in completions rises under GRPO."""
    cfg = _cfg(
        tiny_model_dir,
        tmp_path / "learn",
        reward={"task_reward": False, "functions": [{"path": f"{HERE / 'digits_reward.py'}:digit_share"}]},
        data={"prompts_per_step": 4},
        rollout={"n": 8, "max_new_tokens": 6},
        trainer={"total_steps": 40, "lr": 5e-3},
        monitor={"sample_every": 0},
    )
    result = train(cfg, progress=False)
    rows = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    reward = [r["reward/mean"] for r in rows if r["step"] >= 1]
    first, last = sum(reward[:5]) / 5, sum(reward[-5:]) / 5
    assert last > first + 0.15, (first, last)
