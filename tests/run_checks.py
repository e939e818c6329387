"""Assertions and small configs shared by the end-to-end and integration tests of training runs (imported
by test modules; ``tests/`` is on ``sys.path`` through its ``conftest.py``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tandem.config import build_config
from tandem.config.schema import TandemConfig
from tandem.monitor import read_metrics

DIGITS_REWARD = {
    "task_reward": False,
    "functions": [{"path": f"{Path(__file__).parent / 'e2e' / 'digits_reward.py'}:digit_share"}],
}


def resume_config(model_dir: Path, out: Path, **sections: dict[str, Any]) -> TandemConfig:
    """A four-step GRPO run on the tiny model with a checkpoint every two steps (what the resume tests stop
    and continue); ``sections`` update the config's sections."""
    data: dict[str, Any] = {
        "run": {"output_dir": str(out), "seed": 3},
        "model": {"path": str(model_dir)},
        "data": {"task": "arith", "prompts_per_step": 2, "eval_size": 4, "train_size": 64},
        "rollout": {"n": 4, "max_new_tokens": 4},
        "algorithm": {"name": "grpo"},
        "trainer": {"total_steps": 4, "lr": 1e-3},
        "reward": DIGITS_REWARD,
        "checkpoint": {"every": 2, "keep_last": 5},
        "monitor": {"eval_every": 0, "sample_every": 0, "tensorboard": False, "progress": False},
    }
    for key, value in sections.items():
        data.setdefault(key, {}).update(value)
    return build_config(data)


def step_rows(run_dir: Path) -> list[dict[str, Any]]:
    """The metric rows of training steps (step ≥ 1; step 0 holds the evaluation before training)."""
    return [r for r in read_metrics(run_dir) if r["step"] >= 1]


def check_accounting(result: Any, steps: int, batch: int = 8) -> dict[str, Any]:
    """A decoupled run's sample accounting is exact and no ticket was trained twice; returns it."""
    acc = json.loads((result.run_dir / "summary.json").read_text())["accounting"]
    assert acc["trained_samples"] == steps * batch and acc["trained_batches"] == steps
    assert (
        acc["received_samples"] == acc["trained_samples"] + acc["dropped_samples"] + acc["duplicate_samples"]
    )
    tickets = [r["decoupled/ticket"] for r in step_rows(result.run_dir)]
    assert len(tickets) == len(set(tickets)) == steps, "a ticket was trained twice"
    return acc


def inject_lr_spike_and_spy_rollback(monkeypatch: Any, k: int) -> list[tuple[Path, dict, dict]]:
    """Make the k-th update run with LR × 1000 (once) and record every rollback as (checkpoint, the weights
    saved in it, the policy's weights right after the restore). Returns the list the spy appends to."""
    from safetensors.torch import load_file

    import tandem.orchestration.alerting as alerting_mod
    import tandem.orchestration.parts as parts_mod

    orig_build = parts_mod.build_scheduler

    def faulty_scheduler(opt, cfg, n):
        sched = orig_build(opt, cfg, n)
        base, fired = sched.lr_lambdas[0], [False]

        def lam(i):
            if i == k - 1 and not fired[0]:  # LambdaLR index k-1 sets the LR of the k-th update
                fired[0] = True
                return base(i) * 1000
            return base(i)

        sched.lr_lambdas[0] = lam
        return sched

    restored: list[tuple[Path, dict, dict]] = []
    orig_rollback = alerting_mod.AlertController.rollback

    def spy(self, parts, lr_scale=None):
        ckpt = orig_rollback(self, parts, lr_scale)
        saved = load_file(str(ckpt / "model" / "model.safetensors"))  # read now: later pruning deletes it
        restored.append((ckpt, saved, {n: p.detach().clone() for n, p in parts.policy.state_dict().items()}))
        return ckpt

    monkeypatch.setattr(parts_mod, "build_scheduler", faulty_scheduler)
    monkeypatch.setattr(alerting_mod.AlertController, "rollback", spy)
    return restored


def check_rollback(run_dir: Path, restored: list[tuple[Path, dict, dict]], k: int) -> list[dict[str, Any]]:
    """The first alert rolled back to a checkpoint from before the faulty k-th update, the restored weights
    are that checkpoint's exactly, and the replayed step ran at half its earlier LR. Returns the alerts."""
    import pytest
    import torch

    from tandem.monitor.alerts import read_alerts

    alerts = read_alerts(run_dir)
    assert alerts and alerts[0]["action"] == "rollback" and k <= alerts[0]["step"] <= k + 2
    assert alerts[0]["effect"] == "rolled back to the last good checkpoint"
    ckpt, saved, weights = restored[0]
    assert int(ckpt.name.split("-")[1]) < k  # the restored weights predate the faulty update
    for name, value in saved.items():
        torch.testing.assert_close(weights[name], value, rtol=0, atol=0)
    replayed = int(ckpt.name.split("-")[1]) + 1
    lrs = [r["actor/lr"] for r in read_metrics(run_dir) if r["step"] == replayed]
    assert len(lrs) == 2 and lrs[1] == pytest.approx(0.5 * lrs[0])
    return alerts


def check_average_restored(run_dir: Path, cfg: Any) -> int:
    """A run with a weight average (``trainer.ema_decay``, FSDP2 learner: live weights in the DCP shards)
    that rolled back once, checkpointing every step: the replay's first step ``s`` restarted the average
    from checkpoint ``s - 1``'s, so checkpoint ``s``'s ``model/`` (written by the replay) is checkpoint
    ``s - 1``'s ``model/`` moved once toward step ``s``'s live weights with the decay that step logged.
    An average not restored would have moved from the pre-rollback steps' average instead. With a LoRA
    policy (``model.lora``) the average and ``model/`` cover the adapter only. Returns ``s``."""
    import safetensors.torch
    import torch

    from tandem.models.lora import adapter_state_dict, is_lora
    from tandem.orchestration.build import build_policy
    from tandem.train.checkpoint import SHARDED_STATE, checkpoint_dir
    from tandem.train.fsdp import load_sharded
    from tandem.train.optim import build_optimizer

    rows = step_rows(run_dir)
    steps = [r["step"] for r in rows]
    i = next(i for i in range(1, len(steps)) if steps[i] <= steps[i - 1])  # the replay's first step
    s, decay = steps[i], rows[i]["actor/ema_decay"]
    root = run_dir / "checkpoints"

    model, _ = build_policy(cfg.model, seed=0)
    load_sharded(
        checkpoint_dir(root, s) / SHARDED_STATE, model, build_optimizer(model, cfg.trainer), whole=True
    )
    lora = is_lora(model)
    live = adapter_state_dict(model) if lora else model.state_dict()
    saved = "adapter_model.safetensors" if lora else "model.safetensors"

    def averaged(step: int) -> dict[str, torch.Tensor]:
        return safetensors.torch.load_file(str(checkpoint_dir(root, step) / "model" / saved))

    before, after = averaged(s - 1), averaged(s)
    assert before.keys() == after.keys() and before
    for name, value in after.items():
        torch.testing.assert_close(
            value, torch.lerp(before[name], live[name], 1.0 - decay), rtol=1e-6, atol=1e-7
        )
        assert not torch.equal(value, live[name]), name  # an average, not the live weights
    return s
