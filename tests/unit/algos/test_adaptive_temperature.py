"""``rollout.adaptive_temperature``: the sampling temperature steered to a target entropy — the estimate it
steers on, the batch field that carries the temperature to the learner, and real tiny runs (the engine
samples at it, the learner scores at it, a resume restores it, the config rejects what cannot work)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from rollout_batches import constant_batch

from tandem.algos import AdaptiveEntropy, sampled_entropy
from tandem.channels.base import TrajectoryMessage
from tandem.channels.serialize import decode_message, encode_message
from tandem.config import build_config
from tandem.errors import ConfigError
from tandem.monitor import read_metrics
from tandem.orchestration.runner import train
from tandem.types import RolloutBatch, batch_temperature, concat_rollouts

DIGITS = f"{Path(__file__).parents[2] / 'e2e' / 'digits_reward.py'}:digit_share"


def test_controller_keeps_the_temperature_between_its_bounds():
    c = AdaptiveEntropy(value=1.0, target=0.5, step=0.2, max_value=1.3, min_value=0.7)
    assert [c.update(0.1) for _ in range(3)] == pytest.approx([1.2, 1.3, 1.3])  # too sharp: hotter, capped
    assert [c.update(0.9) for _ in range(5)] == pytest.approx([1.1, 0.9, 0.7, 0.7, 0.7])  # floor, not 0
    with pytest.raises(ValueError, match="min_value"):
        AdaptiveEntropy(value=0.6, target=0.5, step=0.1, max_value=1.3, min_value=0.7)


def test_sampled_entropy_estimates_the_entropy_of_the_sampling_distribution():
    g = torch.Generator().manual_seed(0)
    logits = torch.tensor([2.0, 1.0, 0.5, -1.0, -3.0])
    for temperature in (0.5, 1.0, 1.5):
        logp = torch.log_softmax(logits / temperature, dim=-1)
        exact = float(-(logp.exp() * logp).sum())
        draws = torch.multinomial(logp.exp(), 40_000, replacement=True, generator=g)  # [N]
        behavior = logp[draws].view(200, 200)  # [B, R], each token's log-prob under its distribution
        mask = torch.ones(200, 200, dtype=torch.bool)
        mask[:, 150:] = False  # padding does not count, whatever its log-prob
        behavior[:, 150:] = -50.0
        assert sampled_entropy(behavior, mask) == pytest.approx(exact, abs=0.02)
    assert sampled_entropy(torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.bool)) == 0.0


def _batch(rows: int, temperature: float | None) -> RolloutBatch:
    t = None if temperature is None else torch.full((rows,), temperature)
    return constant_batch([0] * rows, sample_temperature=t)


def _wire(batch: RolloutBatch) -> RolloutBatch:
    """``batch`` after the trajectory channel's encoding and decoding."""
    msg = TrajectoryMessage(batch, torch.zeros(batch.batch_size), ticket=0, worker_id=0, meta={})
    return decode_message(encode_message(msg)).batch


def test_the_batch_carries_its_temperature_through_select_concat_and_the_wire():
    b = concat_rollouts([_batch(2, 1.2), _batch(3, 1.2)], pad_token_id=0)
    assert batch_temperature(b) == pytest.approx(1.2) and b.sample_temperature.shape == (5,)
    assert batch_temperature(b.select([0, 4])) == pytest.approx(1.2)
    assert torch.equal(_wire(b).sample_temperature, b.sample_temperature)
    assert batch_temperature(_batch(2, None)) is None and _wire(_batch(2, None)).sample_temperature is None
    with pytest.raises(ValueError, match="different temperatures"):
        batch_temperature(concat_rollouts([_batch(1, 1.2), _batch(1, 0.8)], pad_token_id=0))
    with pytest.raises(ValueError, match="with and without"):
        concat_rollouts([_batch(1, 1.2), _batch(1, None)], pad_token_id=0)


def _cfg(model_dir, out, steps=4, **adaptive):
    return build_config(
        {
            "run": {"output_dir": str(out), "seed": 2},
            "model": {"path": str(model_dir)},
            "data": {"task": "arith", "prompts_per_step": 2, "eval_size": 0, "train_size": 32},
            "rollout": {"n": 2, "max_new_tokens": 3, "adaptive_temperature": adaptive},
            "algorithm": {"name": "grpo"},
            "reward": {"task_reward": False, "functions": [{"path": DIGITS}]},
            "trainer": {"total_steps": steps, "lr": 3e-3},
            "checkpoint": {"every": 2},
            "monitor": {"eval_every": 0, "sample_every": 0, "tensorboard": False, "progress": False},
        }
    )


def _column(run_dir, key):
    return [r[key] for r in read_metrics(run_dir) if r["step"] >= 1]


def test_runs_sample_and_score_at_the_moving_temperature(tiny_model_dir, tmp_path):
    torch.set_num_threads(1)
    # a target no policy reaches: one step hotter per update, up to the cap
    up = train(_cfg(tiny_model_dir, tmp_path / "up", target_entropy=100.0, step=0.2), progress=False)
    assert _column(up.run_dir, "rollout/temperature") == pytest.approx([1.0, 1.2, 1.4, 1.5])
    # a target every policy exceeds: cooler, down to the floor
    down = train(
        _cfg(tiny_model_dir, tmp_path / "down", target_entropy=1e-6, step=0.2, min_temperature=0.7),
        progress=False,
    )
    assert _column(down.run_dir, "rollout/temperature") == pytest.approx([1.0, 0.8, 0.7, 0.7])
    # the engine sampled at it: hotter sampling, higher entropy of the sampled tokens
    hot = _column(up.run_dir, "rollout/sampled_entropy")
    cold = _column(down.run_dir, "rollout/sampled_entropy")
    assert hot[0] == pytest.approx(cold[0]) and hot[3] > cold[3]  # same first step (both at 1.0)
    # the learner scored every batch at its sampling temperature: the trainer's log-probs equal the engine's
    # (scored at rollout.temperature = 1.0, the steps at 1.4 / 0.7 would differ by far more than 1e-3)
    for run in (up, down):
        assert max(_column(run.run_dir, "rollout/logprob_diff_max")) < 1e-3


def test_resume_restores_the_temperature(tiny_model_dir, tmp_path):
    torch.set_num_threads(1)
    knobs = {"target_entropy": 100.0, "step": 0.1}
    full = train(_cfg(tiny_model_dir, tmp_path / "full", **knobs), progress=False)
    train(_cfg(tiny_model_dir, tmp_path / "half", steps=2, **knobs), progress=False)
    resumed = train(_cfg(tiny_model_dir, tmp_path / "half", steps=4, **knobs), resume=True, progress=False)
    temps = _column(resumed.run_dir, "rollout/temperature")
    assert temps == _column(full.run_dir, "rollout/temperature") == pytest.approx([1.0, 1.1, 1.2, 1.3])


def test_config_errors_name_the_key(tiny_model_dir, tmp_path):
    cases = [
        ({"target_entropy": 0.0}, r"rollout\.adaptive_temperature\.target_entropy"),
        ({"target_entropy": 0.5, "min_temperature": 1.2}, r"rollout\.temperature\b.*outside"),
        (
            {"target_entropy": 0.5, "min_temperature": 1.4, "max_temperature": 1.2},
            r"rollout\.adaptive_temperature\.min_temperature",
        ),
    ]
    for adaptive, match in cases:
        with pytest.raises(ConfigError, match=match):
            _cfg(tiny_model_dir, tmp_path, **adaptive)
