"""The learner update: micro-batching is exact, groups stay whole, schedules are right."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from grad_capture import capture_grads

from tandem.config.schema import AlgorithmConfig, TrainerConfig
from tandem.models import load_causal_lm
from tandem.train.optim import build_optimizer, build_scheduler, lr_factor
from tandem.train.update import UpdateSettings, group_shuffle, policy_update
from tandem.types import Experience, RolloutBatch


def _experience(B=8, P=3, R=5, seed=0) -> Experience:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, R + 1, (B,), generator=g)
    mask = torch.arange(R)[None, :] < lengths[:, None]
    rollout = RolloutBatch(
        prompt_ids=torch.randint(4, 40, (B, P), generator=g),
        prompt_mask=torch.ones(B, P, dtype=torch.bool),
        response_ids=torch.randint(4, 40, (B, R), generator=g) * mask,
        response_mask=mask,
        behavior_logprobs=-torch.rand(B, R, generator=g) * mask,
        group_ids=torch.arange(B) // 4,
        policy_version=torch.zeros(B, dtype=torch.long),
        prompts=["p"] * B,
        completions=["c"] * B,
        finish_reasons=["stop"] * B,
    )
    adv = torch.randn(B, 1, generator=g).expand(B, R) * mask
    return Experience(
        rollout=rollout, scores=torch.randn(B, generator=g), old_logprobs=None, advantages=adv, returns=adv
    )


def _grads_after_one_step(model_dir, exp, aggregation, micro):
    model = load_causal_lm(model_dir)
    algo = AlgorithmConfig(name="grpo", aggregation=aggregation)
    trainer = TrainerConfig(micro_batch_size=micro, max_grad_norm=None, lr=1e-3)
    settings = UpdateSettings.from_config(
        algo, trainer, temperature=1.0, autocast_bf16=False, max_new_tokens=5
    )
    opt = build_optimizer(model, trainer)
    grads = capture_grads(model, opt)
    metrics = policy_update(model, opt, None, exp, settings)
    return grads, metrics


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_micro_batching_gives_the_full_batch_gradient(tiny_model_dir, aggregation):
    exp = _experience()
    full, m_full = _grads_after_one_step(tiny_model_dir, exp, aggregation, None)
    micro, m_micro = _grads_after_one_step(tiny_model_dir, exp, aggregation, 2)
    for name in full:
        torch.testing.assert_close(micro[name], full[name], rtol=1e-4, atol=1e-6)
    assert math.isclose(m_full["actor/pg_loss"], m_micro["actor/pg_loss"], rel_tol=1e-4, abs_tol=1e-6)


def test_group_shuffle_keeps_groups_together():
    groups = torch.tensor([5, 5, 5, 9, 9, 9, 2, 2, 2, 7, 7, 7])
    gen = torch.Generator().manual_seed(1)
    for _ in range(5):
        order = group_shuffle(groups, gen)
        assert sorted(order.tolist()) == list(range(12))
        blocks = groups[order].view(4, 3)
        assert (blocks == blocks[:, :1]).all()


def test_lr_schedule_warmup_then_cosine_to_min_ratio():
    f = [lr_factor(s, warmup=2, total=10, schedule="cosine", min_ratio=0.1) for s in range(11)]
    assert f[0] == pytest.approx(0.5) and f[1] == pytest.approx(1.0)
    assert f[2] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(f[2:], f[3:], strict=False))
    assert f[10] == pytest.approx(0.1)
    assert lr_factor(7, warmup=0, total=10, schedule="constant", min_ratio=0.1) == 1.0


@pytest.mark.parametrize("veto_first", [1, 2])
def test_a_vetoed_update_keeps_its_schedule_slot_without_a_warning(tiny_model_dir, veto_first):
    """A ``skip`` veto drops the optimiser step but the schedule still advances one slot (warm-up and decay
    end where planned): vetoing the run's first update makes PyTorch warn "lr_scheduler.step() before
    optimizer.step()", which is the intent here and silenced; applied updates keep the usual order."""
    model = load_causal_lm(tiny_model_dir)
    trainer = TrainerConfig(mini_batch_size=4, lr=1e-3, warmup_steps=4)
    settings = UpdateSettings.from_config(
        AlgorithmConfig(name="grpo"), trainer, temperature=1.0, autocast_bf16=False, max_new_tokens=5
    )
    opt = build_optimizer(model, trainer)
    sched = build_scheduler(opt, trainer, 8)
    calls = []

    def pre_step(metrics):  # veto the first `veto_first` mini-batch updates, apply the rest
        calls.append(metrics["actor/grad_norm"])
        return len(calls) > veto_first

    before = {k: v.clone() for k, v in model.state_dict().items()}
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*lr_scheduler")  # the scheduler's warnings fail the test
        first = policy_update(model, opt, sched, _experience(), settings, pre_step=pre_step)
        if veto_first == 2:  # both slots of the first update vetoed: the weights have not moved
            assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
        second = policy_update(model, opt, sched, _experience(seed=1), settings, pre_step=pre_step)
    assert len(calls) == 4 and sched.last_epoch == 4  # 2 mini-batches per update, every slot counted
    assert first["actor/skipped_by_alert"] == 1.0 and "actor/skipped_by_alert" not in second
    assert second["actor/lr"] == pytest.approx(
        1e-3 * lr_factor(4, warmup=4, total=8, schedule="cosine", min_ratio=0.1)
    )
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
