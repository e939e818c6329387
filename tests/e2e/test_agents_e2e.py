"""End to end: a user environment loaded by path trains a few steps, colocated and decoupled, GRPO and PPO."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tandem.config import build_config
from tandem.evaluate.runner import run_eval
from tandem.models import load_causal_lm
from tandem.monitor import read_metrics
from tandem.orchestration.runner import train
from tandem.rollout.episodes import EnvError
from tandem.train.checkpoint import latest_checkpoint

HERE = Path(__file__).parent


def _cfg(
    model_dir, out, *, algo="grpo", architecture=None, critic=None, schedule="lockstep", turn_rewards="sum"
):
    data = {
        "run": {"output_dir": str(out), "seed": 1},
        "model": {"path": str(model_dir)},
        "data": {"task": "arith", "prompts_per_step": 2, "eval_size": 4, "train_size": 32},
        "reward": {"task_reward": False},
        "env": {
            "path": f"{HERE / 'agent_envs.py'}:Counter",
            "options": {"bonus": 2.0},
            "max_turns": 3,
            "schedule": schedule,
            "turn_rewards": turn_rewards,
        },
        "rollout": {"n": 4, "max_new_tokens": 4},
        "algorithm": {"name": algo},
        "trainer": {"total_steps": 2, "lr": 1e-3},
        "monitor": {"eval_every": 2, "sample_every": 1, "tensorboard": False, "progress": False},
    }
    if architecture:
        data["architecture"] = architecture
    if critic:
        data["critic"] = critic
    return build_config(data)


@pytest.mark.parametrize(
    ("algo", "architecture", "schedule", "turn_rewards"),
    [
        ("grpo", None, "lockstep", "sum"),
        ("ppo", None, "async", "per_turn"),  # GAE credits each step's reward on its turn
        pytest.param(
            "grpo",
            {"mode": "decoupled", "staleness": 1, "num_workers": 1},
            "async",
            "per_turn",  # the batches cross the channel with their per-turn rewards
            marks=pytest.mark.slow,
        ),
    ],
)
def test_user_env_trains(tiny_model_dir, tmp_path, algo, architecture, schedule, turn_rewards):
    critic = {"lr": 1e-3} if algo == "ppo" else None
    cfg = _cfg(
        tiny_model_dir,
        tmp_path / "run",
        algo=algo,
        architecture=architecture,
        critic=critic,
        schedule=schedule,
        turn_rewards=turn_rewards,
    )
    before = {k: v.clone() for k, v in load_causal_lm(tiny_model_dir).state_dict().items()}
    result = train(cfg, progress=False)
    assert result.steps == 2
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    step_rows = [r for r in rows if "agent/turns_mean" in r]
    assert step_rows, rows[-1].keys()
    assert all(r["agent/turns_mean"] == 2 for r in step_rows)  # the env ends every episode at turn 2
    assert all(r["agent/tool_calls_mean"] == 1 for r in step_rows)
    assert all("timing/env" in r for r in step_rows)
    evals = [r for r in rows if "eval/agent/turns_mean" in r]  # held-out episodes, greedy
    assert evals and all(r["eval/agent/turns_mean"] == 2 for r in evals)
    after = load_causal_lm(latest_checkpoint(result.run_dir / "checkpoints") / "model")
    assert any(not torch.equal(before[k], v) for k, v in after.state_dict().items())
    samples = (result.run_dir / "samples.jsonl").read_text()
    assert "again:" in samples  # samples show the whole conversation


def test_eval_reports_the_agent_metrics_the_run_logged(tiny_model_dir, tmp_path):
    result = train(_cfg(tiny_model_dir, tmp_path / "run"), progress=False)
    logged = [r for r in read_metrics(result.run_dir) if "eval/agent/turns_mean" in r][-1]
    metrics = run_eval(result.run_dir, samples=2)["metrics"]
    agent = [k for k in logged if k.startswith("eval/agent/")]
    assert len(agent) >= 8  # turns, tool calls and errors, kills, timeouts, context, unfinished, return
    for key in [*agent, "eval/accuracy", "eval/reward_mean"]:  # the same held-out episodes, greedy
        assert metrics[key] == pytest.approx(logged[key], abs=1e-7), key
    assert metrics["eval/agent/turns_mean"] == 2 and metrics["eval/agent/tool_calls_mean"] == 1
    # the sampled pass's episodes on their own: 4 prompts x 2 samples, two turns each
    assert metrics["sampled/agent/turns_mean"] == 2 and metrics["sampled/agent/unfinished_frac"] == 0
    assert "eval/timing/env" in metrics and "sampled/timing/env" in metrics
    # rows of another task meet the run's environment: its error says so, in one line
    with pytest.raises(EnvError, match=r"'answer' column.*the run's env.path .*Counter' plays every episode"):
        run_eval(result.run_dir, task="guess", samples=0)


def test_bad_env_fails_before_the_run_folder(tiny_model_dir, tmp_path):
    from tandem.errors import ConfigError

    cfg = _cfg(tiny_model_dir, tmp_path / "run")
    cfg.env.options = {"colour": "red"}
    with pytest.raises(ConfigError, match="env.options"):
        train(cfg, progress=False)
    assert not (tmp_path / "run").exists()
