"""``trainer.skip_zero_advantage``: groups whose advantages are all 0 are left out of the update's forward and
backward only where that leaves the gradient unchanged, and the gradient is then the full batch's."""

from __future__ import annotations

import math

import pytest
import torch
from grad_capture import capture_grads
from rollout_batches import sampled_batch

from tandem.algos import zero_advantage_groups
from tandem.config.schema import AlgorithmConfig, TrainerConfig
from tandem.models import load_causal_lm
from tandem.train.optim import build_optimizer
from tandem.train.update import UpdateSettings, policy_update
from tandem.types import Experience


def test_zero_advantage_groups_takes_whole_groups_and_ignores_padding():
    adv = torch.tensor(
        [
            [0.0, 0.0, 9.0],  # group 0: the 9 is on a padded position, so the group is inert
            [0.0, 0.0, 0.0],
            [0.0, 0.0, 0.0],  # group 1: one zero row beside a non-zero one, kept whole
            [0.5, 0.5, 0.0],
            [float("nan"), 0.0, 0.0],  # group 2: NaN counts as non-zero (kept, caught later)
            [0.0, 0.0, 0.0],  # group 3 (a lone row, listed out of order with group 0)
        ]
    )
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]], dtype=torch.bool)
    groups = torch.tensor([0, 0, 1, 1, 2, 7])
    assert zero_advantage_groups(adv, mask, groups).tolist() == [True, True, False, False, False, True]
    assert zero_advantage_groups(adv[:0], mask[:0], groups[:0]).numel() == 0


def _experience(B=12, n=4, P=3, R=5, seed=0, inert=(1,)) -> Experience:
    """Groups of ``n`` rows; the groups in ``inert`` have all-equal scores, hence zero GRPO advantages."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, R + 1, (B,), generator=g)
    groups = torch.arange(B) // n
    prompts = torch.randint(4, 40, (B // n, P), generator=g).repeat_interleave(n, dim=0)
    rollout = sampled_batch(prompts, torch.ones(B, P, dtype=torch.bool), lengths, R, n, g)
    mask = rollout.response_mask
    per_row = torch.randn(B, generator=g)
    for k in inert:
        per_row[groups == k] = 0.0
    adv = per_row[:, None].expand(B, R) * mask
    return Experience(rollout=rollout, scores=per_row.clone(), old_logprobs=None, advantages=adv, returns=adv)


def _step(model_dir, exp, skip, algo_kw=None, **trainer_kw):
    """Gradients, metrics and the batch sizes the model's forward saw in one update."""
    model = load_causal_lm(model_dir)
    algo = AlgorithmConfig(name="grpo", **(algo_kw or {}))
    trainer = TrainerConfig(max_grad_norm=None, lr=1e-3, skip_zero_advantage=skip, **trainer_kw)
    settings = UpdateSettings.from_config(
        algo, trainer, temperature=1.0, autocast_bf16=False, max_new_tokens=5, share_prefix=True
    )
    opt = build_optimizer(model, trainer)
    grads = capture_grads(model, opt)
    seen: list[int] = []
    model.register_forward_pre_hook(
        lambda _m, args, kw: seen.append(int(kw["input_ids"].shape[0])), with_kwargs=True
    )
    gen = torch.Generator().manual_seed(0)  # the same mini-batch order in every call
    metrics = policy_update(model, opt, None, exp, settings, generator=gen)
    return grads, metrics, seen, settings


@pytest.mark.parametrize(
    ("loss", "aggregation"),
    [
        ("ppo_clip", "token-mean"),
        ("ppo_clip", "seq-mean-token-mean"),
        ("ppo_clip", "seq-mean-token-sum-norm"),
        ("gspo", "seq-mean-token-mean"),
        ("cispo", "token-mean"),
        ("topr", "token-mean"),
    ],
)
def test_skipping_inert_groups_keeps_the_full_batch_gradient(tiny_model_dir, loss, aggregation):
    exp = _experience()
    algo = {"policy_loss": loss, "aggregation": aggregation}
    full, m_full, seen_full, _ = _step(tiny_model_dir, exp, False, algo)
    part, m_part, seen_part, settings = _step(tiny_model_dir, exp, True, algo)
    assert settings.skip_zero_advantage
    assert sum(seen_full) > sum(seen_part)  # the inert group's rows never reached the model
    assert m_part["actor/trained_frac"] == pytest.approx(8 / 12)
    assert set(full) == set(part)
    for name in full:
        torch.testing.assert_close(part[name], full[name], rtol=1e-4, atol=1e-7)
    assert math.isclose(m_full["actor/pg_loss"], m_part["actor/pg_loss"], rel_tol=1e-4, abs_tol=1e-7)
    assert math.isclose(m_full["actor/grad_norm"], m_part["actor/grad_norm"], rel_tol=1e-4)


def test_micro_batches_and_mini_batches_skip_per_mini_batch(tiny_model_dir):
    exp = _experience(B=16, inert=(0, 3))
    kw = {"micro_batch_size": 4, "mini_batch_size": 8}
    full, m_full, _, _ = _step(tiny_model_dir, exp, False, **kw)
    part, m_part, _, _ = _step(tiny_model_dir, exp, True, **kw)
    for name in full:  # the last mini-batch's gradient; the first step already moved both models alike
        torch.testing.assert_close(part[name], full[name], rtol=1e-4, atol=1e-7)
    assert m_part["actor/trained_frac"] == pytest.approx(0.5)  # mean over the two mini-batches


def test_all_inert_runs_every_row(tiny_model_dir):
    """Nothing to learn from: every row runs, so the optimiser takes its usual step (AdamW's moments move)."""
    exp = _experience(inert=(0, 1, 2))
    _, metrics, seen, _ = _step(tiny_model_dir, exp, True)
    _, _, seen_off, _ = _step(tiny_model_dir, exp, False)
    assert seen == seen_off and metrics["actor/trained_frac"] == 1.0


@pytest.mark.parametrize(
    "algo_kw",
    [
        {"entropy_coef": 0.01},
        {"sft_coef": 0.1},
        {"beta": 0.05, "kl": {"where": "loss"}},
        {"policy_loss": "agro", "aggregation": "seq-mean-token-mean"},
    ],
)
def test_terms_that_see_inert_rows_turn_skipping_off(algo_kw):
    settings = UpdateSettings.from_config(
        AlgorithmConfig(name="grpo", **algo_kw),
        TrainerConfig(),
        temperature=1.0,
        autocast_bf16=False,
        max_new_tokens=5,
    )
    assert not settings.skip_zero_advantage
    on = UpdateSettings.from_config(
        AlgorithmConfig(name="grpo"), TrainerConfig(), temperature=1.0, autocast_bf16=False, max_new_tokens=5
    )
    assert on.skip_zero_advantage  # the default recipe skips
