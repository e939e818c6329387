"""critic.shared_backbone: a value head on the policy — one forward gives log-probs and values, the value
loss reaches the backbone in the policy's own backward, warm-up trains the head alone, config errors."""

from __future__ import annotations

import pytest
import torch
from rollout_batches import sampled_batch

from tandem.config import build_config
from tandem.config.schema import AlgorithmConfig, CriticConfig, TrainerConfig
from tandem.errors import ConfigError, ModelError
from tandem.models import load_causal_lm
from tandem.models.forward import prompt_runs, response_logprobs
from tandem.models.value import SharedValueHead, ValueCapture, build_shared_value_head
from tandem.train.critic import CriticSettings, add_value_head_group, critic_update, shared_value
from tandem.train.experience import ExperienceSettings, make_experience
from tandem.train.optim import build_optimizer
from tandem.train.update import UpdateSettings, policy_update
from tandem.types import RolloutBatch


def _grouped_rollout(B=4, n=2, P=3, R=5, seed=0) -> RolloutBatch:
    """``B / n`` prompts, each repeated over ``n`` consecutive rows (a GRPO-style group), some left padding."""
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(4, 40, (B // n, P), generator=g).repeat_interleave(n, dim=0)  # [B, P]
    prompt_mask = torch.ones(B, P, dtype=torch.bool)
    prompt_mask[:n, 0] = False  # first group left padded by one
    prompt = prompt * prompt_mask
    lengths = torch.randint(2, R + 1, (B,), generator=g)
    return sampled_batch(prompt, prompt_mask, lengths, R, n, g)


def _head(tiny_model_dir) -> tuple[torch.nn.Module, SharedValueHead]:
    policy = load_causal_lm(tiny_model_dir)
    return policy, build_shared_value_head(policy, seed=3)


def _exp_settings() -> ExperienceSettings:
    algo = AlgorithmConfig(name="ppo", norm_by_std=False)
    return ExperienceSettings.from_config(algo, temperature=1.0, autocast_bf16=False, micro_batch_size=None)


@pytest.mark.parametrize("share", [False, True])
def test_one_forward_gives_logprobs_and_the_heads_values_on_the_hidden_states(tiny_model_dir, share):
    """Plain and shared-prefix scoring: values captured in the policy forward equal the head applied to the
    decoder's last hidden state at the position that predicts each token; log-probs are unchanged."""
    policy, head = _head(tiny_model_dir)
    r = _grouped_rollout()
    args = (r.prompt_ids, r.prompt_mask, r.response_ids, r.response_mask)
    with torch.no_grad():
        hidden = policy.get_decoder()(
            input_ids=torch.cat([r.prompt_ids, r.response_ids], 1),
            attention_mask=torch.cat([r.prompt_mask, r.response_mask], 1).long(),
            position_ids=(torch.cat([r.prompt_mask, r.response_mask], 1).long().cumsum(1) - 1).clamp(min=0),
        ).last_hidden_state  # [B, P+R, H]
        R = r.response_ids.shape[1]
        expected = head.head(hidden[:, -R - 1 : -1]).squeeze(-1) * r.response_mask  # [B, R]
        plain_lp, _ = response_logprobs(policy, *args)
        with head.capture() as cap:
            lp, _ = response_logprobs(policy, *args, share_prefix=share)
        values = cap.values(r.response_mask, prompt_runs(r.prompt_ids, r.prompt_mask) if share else None)
    assert len(cap.calls) == (2 if share else 1)  # the shared-prefix path really ran
    torch.testing.assert_close(values, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(head.values(*args), expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(lp, plain_lp, rtol=1e-5, atol=1e-6)
    assert torch.all(values[~r.response_mask] == 0) and values[r.response_mask].abs().sum() > 0


def test_shared_prefix_values_follow_ragged_runs_and_need_them(tiny_model_dir):
    """Runs of 3 and 1 rows (a grown group, a lone row): each row's first value comes from its own run's
    prompt; without the runs the shared-prefix calls are refused rather than guessed."""
    policy, head = _head(tiny_model_dir)
    r = _grouped_rollout(B=6, n=3).select(torch.tensor([0, 1, 2, 3]))  # runs [0, 0, 0, 1]
    args = (r.prompt_ids, r.prompt_mask, r.response_ids, r.response_mask)
    runs = prompt_runs(r.prompt_ids, r.prompt_mask)
    assert runs.tolist() == [0, 0, 0, 1]
    with torch.no_grad():
        with head.capture() as plain:
            response_logprobs(policy, *args)
        with head.capture() as cap:
            response_logprobs(policy, *args, share_prefix=True)
    assert [tuple(c.shape) for c in cap.calls][0] == (2, 1)
    torch.testing.assert_close(
        cap.values(r.response_mask, runs), plain.values(r.response_mask), rtol=1e-5, atol=1e-6
    )
    with pytest.raises(ModelError, match="cannot align"):
        cap.values(r.response_mask)


def test_capture_refuses_calls_it_cannot_align():
    cap = ValueCapture()
    cap.calls = [torch.zeros(4, 3), torch.zeros(4, 3), torch.zeros(4, 3)]  # e.g. a micro-batched scoring
    with pytest.raises(ModelError, match="cannot align"):
        cap.values(torch.ones(4, 5, dtype=torch.bool))


def test_head_state_is_the_head_alone_and_round_trips(tiny_model_dir, tmp_path):
    policy, head = _head(tiny_model_dir)
    assert set(head.state_dict()) == {"head.weight", "head.bias"}
    assert {id(p) for p in head.parameters()}.isdisjoint(id(p) for p in policy.parameters())
    head.save(tmp_path / "h.safetensors")
    other = build_shared_value_head(policy, seed=99)
    assert not torch.equal(other.head.weight, head.head.weight)
    other.load(tmp_path / "h.safetensors")
    assert torch.equal(other.head.weight, head.head.weight) and torch.equal(other.head.bias, head.head.bias)


def _joint(tiny_model_dir, r, scores, *, share=False, micro=None):
    """Policy + head, one optimiser with the head group, the experience of ``r`` and the settings."""
    policy, head = _head(tiny_model_dir)
    # lr 1e-3: repeated updates on one batch lower the value loss at every step (at 1e-2 Adam overshoots
    # and the loss oscillates, so where a given step lands would depend on float rounding)
    trainer = TrainerConfig(lr=1e-3, max_grad_norm=None, micro_batch_size=micro, shared_prefix=True)
    critic_cfg = CriticConfig(lr=1e-3, value_clip=None)
    opt = build_optimizer(policy, trainer)
    add_value_head_group(opt, head, critic_cfg, trainer)
    us = UpdateSettings.from_config(
        AlgorithmConfig(name="ppo"),
        trainer,
        temperature=1.0,
        autocast_bf16=False,
        max_new_tokens=r.response_ids.shape[1],
        share_prefix=share,
    )
    cs = CriticSettings.from_config(critic_cfg, trainer, autocast_bf16=False)
    exp, metrics = make_experience(r, scores, _exp_settings(), critic=head)
    return policy, head, opt, us, cs, exp, metrics


def test_value_loss_reaches_the_backbone_in_one_backward(tiny_model_dir):
    """With zero advantages the policy loss has no gradient, so every backbone gradient comes from the
    value loss — through the shared hidden states; the policy moves and the head learns."""
    r, scores = _grouped_rollout(), torch.tensor([1.0, 0.0, 0.5, 0.2])
    policy, head, opt, us, cs, exp, _ = _joint(tiny_model_dir, r, scores)
    exp.advantages.zero_()
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    metrics = policy_update(policy, opt, None, exp, us, value=shared_value(head, cs))
    layer = policy.get_decoder().layers[0].self_attn.q_proj.weight
    assert layer.grad is not None and layer.grad.abs().sum() > 0
    assert head.head.weight.grad is not None and head.head.weight.grad.abs().sum() > 0
    assert any(not torch.equal(before[k], v) for k, v in policy.state_dict().items())
    assert metrics["critic/vf_loss"] > 0 and 0.0 <= metrics["critic/vf_clipfrac"] <= 1.0
    assert abs(metrics["actor/pg_loss"]) < 1e-7  # zero advantages: the loss that moved it is the value's


@pytest.mark.parametrize(("share", "micro"), [(False, None), (False, 2), (True, 2)])
def test_joint_update_lowers_value_loss_and_micro_batching_is_exact(tiny_model_dir, share, micro):
    r, scores = _grouped_rollout(), torch.tensor([1.0, 0.0, 0.5, 0.2])
    policy, head, opt, us, cs, exp, _ = _joint(tiny_model_dir, r, scores, share=share, micro=micro)
    value = shared_value(head, cs)
    losses = [policy_update(policy, opt, None, exp, us, value=value)["critic/vf_loss"] for _ in range(5)]
    assert all(b < a for a, b in zip(losses, losses[1:], strict=False)), losses
    # the first loss does not depend on micro-batching or the shared prefix (same weights, same batch)
    _, head0, _, _, _, exp0, _ = _joint(tiny_model_dir, r, scores)
    with torch.no_grad():
        v0 = head0.values(r.prompt_ids, r.prompt_mask, r.response_ids, r.response_mask)
    mask = r.response_mask
    expected = float((0.5 * (v0 - exp0.returns) ** 2 * mask).sum() / mask.sum())
    assert losses[0] == pytest.approx(expected, rel=1e-4)


def test_warmup_update_moves_only_the_head(tiny_model_dir):
    r, scores = _grouped_rollout(), torch.tensor([1.0, 0.0, 0.5, 0.2])
    policy, head, opt, _, cs, exp, _ = _joint(tiny_model_dir, r, scores)
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    w = head.head.weight.clone()
    metrics = critic_update(head, opt, exp, cs)
    assert metrics["critic/vf_loss"] > 0
    assert not torch.equal(head.head.weight, w)
    for k, v in policy.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_shared_value_needs_a_shared_head(tiny_model_dir):
    cs = CriticSettings.from_config(CriticConfig(), TrainerConfig(), autocast_bf16=False)
    with pytest.raises(TypeError, match="SharedValueHead"):
        shared_value(torch.nn.Linear(2, 1), cs)


def _cfg(tiny_model_dir, tmp_path, critic, **overrides):
    data = {
        "run": {"output_dir": str(tmp_path / "run")},
        "model": {"path": str(tiny_model_dir)},
        "data": {"task": "arith"},
        "algorithm": {"name": "ppo"},
        "critic": critic,
    }
    data.update(overrides)
    return build_config(data)


def test_config_keys_and_cross_field_errors(tiny_model_dir, tmp_path):
    assert _cfg(tiny_model_dir, tmp_path, {}).critic.shared_backbone is False
    assert _cfg(tiny_model_dir, tmp_path, {"shared_backbone": True}).critic.shared_backbone is True
    with pytest.raises(ConfigError, match=r"critic\.path") as err:
        _cfg(tiny_model_dir, tmp_path, {"shared_backbone": True, "path": str(tiny_model_dir)})
    assert "\n" not in str(err.value)
    arch = {"mode": "decoupled", "learner": {"world_size": 2}}
    dp = _cfg(tiny_model_dir, tmp_path, {"shared_backbone": True}, architecture=arch)
    assert dp.critic.shared_backbone  # the data-parallel learner trains the head too
    decoupled = _cfg(tiny_model_dir, tmp_path, {"shared_backbone": True}, architecture={"mode": "decoupled"})
    assert decoupled.critic.shared_backbone  # the decoupled learner trains critics too
