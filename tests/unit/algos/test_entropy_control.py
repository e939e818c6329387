"""``algorithm.entropy_target``: the entropy coefficient's controller, alone and inside real tiny runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tandem.algos import AdaptiveEntropy
from tandem.config import build_config
from tandem.errors import ConfigError
from tandem.monitor import read_metrics
from tandem.orchestration.runner import train

DIGITS = f"{Path(__file__).parents[2] / 'e2e' / 'digits_reward.py'}:digit_share"


def test_controller_moves_by_step_towards_the_target_within_bounds():
    c = AdaptiveEntropy(value=0.0, target=0.5, step=0.01, max_value=0.025)
    assert [c.update(0.2) for _ in range(4)] == pytest.approx([0.01, 0.02, 0.025, 0.025])  # below: up, capped
    assert [c.update(0.9) for _ in range(4)] == pytest.approx([0.015, 0.005, 0.0, 0.0])  # above: down to 0
    for bad in ({"target": 0.0}, {"step": 0.0}, {"value": 0.1}, {"value": -0.01}):
        with pytest.raises(ValueError):
            AdaptiveEntropy(**{"value": 0.0, "target": 0.5, "step": 0.01, "max_value": 0.05, **bad})


def _cfg(model_dir, out, steps=4, **algo):
    return build_config(
        {
            "run": {"output_dir": str(out), "seed": 2},
            "model": {"path": str(model_dir)},
            "data": {"task": "arith", "prompts_per_step": 2, "eval_size": 0, "train_size": 32},
            "rollout": {"n": 2, "max_new_tokens": 3},
            "algorithm": {"name": "grpo", **algo},
            "reward": {"task_reward": False, "functions": [{"path": DIGITS}]},
            "trainer": {"total_steps": steps, "lr": 3e-3},
            "checkpoint": {"every": 2},
            "monitor": {"eval_every": 0, "sample_every": 0, "tensorboard": False, "progress": False},
        }
    )


def _coefs(run_dir):
    return [r["actor/entropy_coef"] for r in read_metrics(run_dir) if r["step"] >= 1]


def test_runs_use_and_move_the_coefficient(tiny_model_dir, tmp_path):
    torch.set_num_threads(1)
    # a target no policy reaches: the coefficient rises by one step per update, up to its cap
    up = train(
        _cfg(
            tiny_model_dir,
            tmp_path / "up",
            entropy_target=100.0,
            entropy_coef_step=0.02,
            entropy_coef_max=0.05,
        ),
        progress=False,
    )
    assert _coefs(up.run_dir) == pytest.approx([0.0, 0.02, 0.04, 0.05])
    # a target every policy exceeds: from 0.03 down to 0
    down = train(
        _cfg(
            tiny_model_dir, tmp_path / "down", entropy_target=1e-9, entropy_coef=0.03, entropy_coef_step=0.02
        ),
        progress=False,
    )
    assert _coefs(down.run_dir) == pytest.approx([0.03, 0.01, 0.0, 0.0])
    # the bonus reaches the loss: step 1 (coefficient 0) is the plain run's; at step 2 the policies are still
    # equal and the loss is lower by the bonus 0.02 x entropy
    plain = train(_cfg(tiny_model_dir, tmp_path / "plain"), progress=False)
    a = [r["actor/loss"] for r in read_metrics(up.run_dir) if r["step"] >= 1]
    b = [r["actor/loss"] for r in read_metrics(plain.run_dir) if r["step"] >= 1]
    assert a[0] == b[0] and a[1] < b[1] - 1e-4


def test_resume_restores_the_coefficient(tiny_model_dir, tmp_path):
    torch.set_num_threads(1)
    knobs = {"entropy_target": 100.0, "entropy_coef_step": 0.01}
    full = train(_cfg(tiny_model_dir, tmp_path / "full", **knobs), progress=False)
    half = _cfg(tiny_model_dir, tmp_path / "half", steps=2, **knobs)
    train(half, progress=False)
    resumed = train(_cfg(tiny_model_dir, tmp_path / "half", steps=4, **knobs), resume=True, progress=False)
    assert _coefs(resumed.run_dir) == _coefs(full.run_dir) == pytest.approx([0.0, 0.01, 0.02, 0.03])


def test_config_errors_name_the_key(tiny_model_dir, tmp_path):
    cases = [
        ({"entropy_target": 0.0}, r"algorithm\.entropy_target"),
        (
            {"entropy_target": 0.3, "entropy_coef": 0.1, "entropy_coef_max": 0.05},
            r"algorithm\.entropy_coef\b.*above",
        ),
        ({"entropy_target": 0.3, "entropy_coef": -0.1}, r"algorithm\.entropy_coef\b.*below 0"),
    ]
    for algo, match in cases:
        with pytest.raises(ConfigError, match=match):
            _cfg(tiny_model_dir, tmp_path, **algo)
