"""The learner logs the train–inference mismatch once per step, on the log-probs before any update: from
the first forward of a single-pass update or from the recomputed old log-probs, never both; micro-batching
does not change it (means are token-weighted, maxima are maxima)."""

from __future__ import annotations

import pytest
import torch

from tandem.algos import logprob_mismatch
from tandem.config.schema import AlgorithmConfig, TrainerConfig
from tandem.models import load_causal_lm
from tandem.train.experience import ExperienceSettings, make_experience, scoring_logprobs
from tandem.train.optim import build_optimizer
from tandem.train.update import UpdateSettings, accumulate_metric, metric_reduction, policy_update
from tandem.types import Experience, RolloutBatch

KEYS = ("rollout/logprob_diff_mean", "rollout/logprob_diff_max", "rollout/ratio_outside_frac")


def _rollout(B=8, P=3, R=5, seed=0) -> RolloutBatch:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, R + 1, (B,), generator=g)
    mask = torch.arange(R)[None, :] < lengths[:, None]  # [B, R] ragged
    return RolloutBatch(
        prompt_ids=torch.randint(4, 40, (B, P), generator=g),
        prompt_mask=torch.ones(B, P, dtype=torch.bool),
        response_ids=torch.randint(4, 40, (B, R), generator=g) * mask,
        response_mask=mask,
        behavior_logprobs=(-torch.rand(B, R, generator=g) * 6).masked_fill(~mask, -float("inf")),
        group_ids=torch.arange(B) // 4,
        policy_version=torch.zeros(B, dtype=torch.long),
        prompts=["p"] * B,
        completions=["c"] * B,
        finish_reasons=["stop"] * B,
    )


def _settings(**trainer) -> tuple[UpdateSettings, ExperienceSettings, TrainerConfig]:
    algo = AlgorithmConfig(name="grpo", correction="token_tis")
    tcfg = TrainerConfig(max_grad_norm=None, lr=1e-2, **trainer)
    upd = UpdateSettings.from_config(algo, tcfg, temperature=1.0, autocast_bf16=False, max_new_tokens=5)
    exp = ExperienceSettings.from_config(algo, temperature=1.0, autocast_bf16=False, micro_batch_size=None)
    return upd, exp, tcfg


def _expected(model_dir, rollout: RolloutBatch) -> dict[str, float]:
    _, exp_settings, _ = _settings()
    lp = scoring_logprobs(load_causal_lm(model_dir), rollout, exp_settings)  # the weights before the update
    return {
        f"rollout/{k}": v
        for k, v in logprob_mismatch(lp, rollout.behavior_logprobs, rollout.response_mask).items()
    }


@pytest.mark.parametrize("micro", [None, 3, 1])
def test_single_pass_update_measures_its_first_forward(tiny_model_dir, micro):
    rollout = _rollout()
    upd, exp_settings, tcfg = _settings(micro_batch_size=micro)
    assert upd.on_policy_single_pass
    model = load_causal_lm(tiny_model_dir)
    exp, exp_metrics = make_experience(rollout, torch.randn(rollout.batch_size), exp_settings)
    assert not any(k.startswith("rollout/") for k in exp_metrics)  # no old pass: measured in the update
    metrics = policy_update(model, build_optimizer(model, tcfg), None, exp, upd)
    want = _expected(tiny_model_dir, rollout)
    assert want["rollout/logprob_diff_mean"] > 0.5 and want["rollout/ratio_outside_frac"] > 0.1  # not vacuous
    for key in KEYS:
        assert metrics[key] == pytest.approx(want[key], rel=1e-5), key


def test_micro_batched_extremes_are_extremes_not_averages(tiny_model_dir):
    rollout = _rollout()
    exp = Experience(
        rollout=rollout,
        scores=torch.zeros(8),
        old_logprobs=None,
        advantages=torch.randn(8, 5, generator=torch.Generator().manual_seed(1)) * rollout.response_mask,
        returns=torch.zeros(8, 5),
    )
    out = {}
    for micro in (None, 2):
        upd, _, tcfg = _settings(micro_batch_size=micro)
        model = load_causal_lm(tiny_model_dir)
        out[micro] = policy_update(model, build_optimizer(model, tcfg), None, exp, upd)
    for key in ("rollout/logprob_diff_max", "actor/correction_weight_max", "actor/correction_weight_min"):
        assert out[2][key] == pytest.approx(out[None][key], rel=1e-5), key
    assert out[None]["actor/correction_weight_min"] < out[None]["actor/correction_weight_mean"]


def test_recomputed_old_logprobs_are_measured_once_before_the_update(tiny_model_dir):
    rollout = _rollout()
    upd, exp_settings, tcfg = _settings(ppo_epochs=2, mini_batch_size=4, micro_batch_size=2)
    assert not upd.on_policy_single_pass
    model = load_causal_lm(tiny_model_dir)
    exp, exp_metrics = make_experience(rollout, torch.randn(8), exp_settings, policy=model)
    want = _expected(tiny_model_dir, rollout)
    for key in KEYS:
        assert exp_metrics[key] == pytest.approx(want[key], rel=1e-6), key
    metrics = policy_update(model, build_optimizer(model, tcfg), None, exp, upd)
    assert not any(k.startswith("rollout/") for k in metrics)  # not again after the weights moved


def test_metric_reduction_by_suffix():
    assert [metric_reduction(k) for k in ("a/x_max", "a/x_min", "a/x_mean", "a/maximum")] == [
        "max",
        "min",
        "sum",
        "sum",
    ]
    acc: dict[str, float] = {}
    for value, weight in ((3.0, 0.25), (-1.0, 0.75)):
        for key in ("m_max", "m_min", "m"):
            accumulate_metric(acc, key, value, weight)
    assert acc == {"m_max": 3.0, "m_min": -1.0, "m": 0.0}
