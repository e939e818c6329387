"""The critic: value alignment, GAE wiring, the critic update, the KL controller, config checks."""

from __future__ import annotations

import pytest
import torch
from rollout_batches import sampled_batch

from tandem.algos import AdaptiveKL
from tandem.config import build_config
from tandem.config.schema import AlgorithmConfig, CriticConfig, TrainerConfig
from tandem.errors import ConfigError
from tandem.models import build_value_model
from tandem.train.critic import CriticSettings, build_critic_optimizer, critic_update
from tandem.train.experience import ExperienceSettings, make_experience
from tandem.types import RolloutBatch


def _rollout(B=4, P=3, R=5, seed=0, left_pad=0) -> RolloutBatch:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, R + 1, (B,), generator=g)
    prompt = torch.randint(4, 40, (B, P), generator=g)  # [B, P]
    prompt_mask = torch.ones(B, P, dtype=torch.bool)
    if left_pad:
        prompt = torch.cat([torch.zeros(B, left_pad, dtype=torch.long), prompt], dim=1)
        prompt_mask = torch.cat([torch.zeros(B, left_pad, dtype=torch.bool), prompt_mask], dim=1)
    return sampled_batch(prompt, prompt_mask, lengths, R, 2, g)


def _exp_settings(**algo) -> ExperienceSettings:
    a = AlgorithmConfig(name="ppo", **algo)
    return ExperienceSettings.from_config(a, temperature=1.0, autocast_bf16=False, micro_batch_size=None)


def test_values_are_unchanged_by_left_padding(tiny_model_dir):
    critic = build_value_model(tiny_model_dir)
    r, padded = _rollout(), _rollout(left_pad=3)
    with torch.no_grad():
        v = critic.values(r.prompt_ids, r.prompt_mask, r.response_ids, r.response_mask)  # [B, R]
        vp = critic.values(padded.prompt_ids, padded.prompt_mask, padded.response_ids, padded.response_mask)
    assert v.shape == r.response_mask.shape
    torch.testing.assert_close(v, vp, rtol=1e-5, atol=1e-5)
    assert torch.all(v[~r.response_mask] == 0)
    assert v[r.response_mask].abs().sum() > 0


def test_value_of_a_token_depends_only_on_the_tokens_before_it(tiny_model_dir):
    critic = build_value_model(tiny_model_dir)
    r = _rollout(B=2, R=5)
    r.response_mask[:] = True
    changed = r.response_ids.clone()
    changed[:, 3] = (changed[:, 3] + 1) % 40 + 4  # token 3 is predicted at position P-1+3: V_0..V_3 unchanged
    with torch.no_grad():
        v = critic.values(r.prompt_ids, r.prompt_mask, r.response_ids, r.response_mask)
        v2 = critic.values(r.prompt_ids, r.prompt_mask, changed, r.response_mask)
    torch.testing.assert_close(v[:, :4], v2[:, :4])
    assert not torch.allclose(v[:, 4], v2[:, 4])


def test_gae_advantages_depend_on_critic_values(tiny_model_dir):
    r, scores = _rollout(), torch.tensor([1.0, 0.0, 0.5, 0.2])
    s = _exp_settings(norm_by_std=False)
    assert s.needs_values
    critic = build_value_model(tiny_model_dir)
    exp, metrics = make_experience(r, scores, s, critic=critic)
    assert exp.values is not None and exp.values.shape == r.response_mask.shape
    with torch.no_grad():
        critic.head.bias.add_(1.0)  # every value + 1
    exp2, _ = make_experience(r, scores, s, critic=critic)
    torch.testing.assert_close(exp2.values, (exp.values + 1) * r.response_mask)
    assert not torch.allclose(exp.advantages, exp2.advantages)
    last = r.response_mask.sum(1) - 1  # [B] index of the last response token
    for e in (exp, exp2):  # the return of the last token is the score, whatever the values
        torch.testing.assert_close(e.returns[torch.arange(4), last], scores)
    assert "critic/explained_var" in metrics and "critic/values_mean" in metrics
    with pytest.raises(ValueError, match="needs critic values"):
        make_experience(r, scores, s)


def test_critic_update_reduces_value_loss_and_micro_batching_is_exact(tiny_model_dir):
    r, scores = _rollout(B=4), torch.tensor([1.0, 0.0, 0.5, 0.2])
    s = _exp_settings()
    results = []
    for micro in (None, 2):
        critic = build_value_model(tiny_model_dir)
        exp, _ = make_experience(r, scores, s, critic=critic)
        trainer = TrainerConfig(ppo_epochs=1, micro_batch_size=micro, max_grad_norm=None)
        # lr 1e-3: small steps on one fixed batch descend at every step (at 1e-2 Adam overshoots and the
        # loss oscillates, so where step 5 lands would depend on the machine's float rounding)
        cs = CriticSettings.from_config(CriticConfig(lr=1e-3, value_clip=None), trainer, autocast_bf16=False)
        opt = build_critic_optimizer(critic, CriticConfig(lr=1e-3), trainer)
        before = {k: v.clone() for k, v in critic.state_dict().items()}
        losses = [critic_update(critic, opt, exp, cs)["critic/vf_loss"] for _ in range(5)]
        assert all(b < a for a, b in zip(losses, losses[1:], strict=False)), losses
        assert any(not torch.equal(before[k], v) for k, v in critic.state_dict().items())
        results.append(losses[0])
    assert results[0] == pytest.approx(results[1], rel=1e-5)


def test_value_clip_limits_the_move_and_reports_clipfrac(tiny_model_dir):
    r, scores = _rollout(B=4), torch.tensor([5.0, -5.0, 5.0, -5.0])
    critic = build_value_model(tiny_model_dir)
    exp, _ = make_experience(r, scores, _exp_settings(), critic=critic)
    trainer = TrainerConfig(ppo_epochs=4)
    cs = CriticSettings.from_config(CriticConfig(value_clip=1e-4), trainer, autocast_bf16=False)
    opt = build_critic_optimizer(critic, CriticConfig(lr=1e-2), trainer)
    metrics = critic_update(critic, opt, exp, cs)
    assert 0.0 < metrics["critic/vf_clipfrac"] <= 1.0


def test_adaptive_kl_moves_towards_the_target():
    up, down = AdaptiveKL(0.1, target=0.05, horizon=100), AdaptiveKL(0.1, target=0.05, horizon=100)
    assert up.update(0.5, 10) > 0.1  # KL above target -> stronger penalty
    assert down.update(0.001, 10) < 0.1  # KL below target -> weaker penalty


def _ppo_config(tiny_model_dir, tmp_path, **overrides):
    data = {
        "run": {"output_dir": str(tmp_path / "run")},
        "model": {"path": str(tiny_model_dir)},
        "data": {"task": "arith"},
        "algorithm": {"name": "ppo"},
        "critic": {},
    }
    data.update(overrides)
    return build_config(data)


def test_ppo_preset_and_cross_field_checks(tiny_model_dir, tmp_path):
    cfg = _ppo_config(tiny_model_dir, tmp_path, algorithm={"name": "ppo", "kl": {"kind": "k1"}})
    a = cfg.algorithm
    assert (a.advantage, a.policy_loss, a.aggregation, a.kl.where, a.kl.kind) == (
        "gae",
        "ppo_clip",
        "token-mean",
        "reward",
        "k1",
    )
    assert (a.gamma, a.lam) == (1.0, 0.95)
    with pytest.raises(ConfigError, match="critic"):
        build_config(
            {"model": {"path": str(tiny_model_dir)}, "data": {"task": "arith"}, "algorithm": {"name": "ppo"}}
        )
    with pytest.raises(ConfigError, match="kl.controller"):
        _ppo_config(tiny_model_dir, tmp_path, algorithm={"name": "ppo", "kl": {"controller": "adaptive"}})
    decoupled = _ppo_config(tiny_model_dir, tmp_path, architecture={"mode": "decoupled"})
    assert decoupled.critic is not None  # the decoupled learner trains the critic too
