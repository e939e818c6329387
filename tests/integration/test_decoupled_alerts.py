"""Alerts in the decoupled runtime: the shared loop's alert controller checks the learner's metrics, the
staleness rules' threshold defaults to η, ``stop`` checkpoints and ends the run, ``rollback`` restores a
checkpoint and carries on (a DDP learner's ranks too; refused up front only with an FSDP2 learner)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from run_checks import check_average_restored, check_rollback, inject_lr_spike_and_spy_rollback

from tandem.config import build_config
from tandem.monitor import read_metrics
from tandem.monitor.alerts import read_alerts
from tandem.orchestration.alerting import AlertStopError
from tandem.orchestration.decoupled.runtime import train_decoupled
from tandem.train.checkpoint import list_checkpoints

DIGITS = f"{Path(__file__).parents[1] / 'e2e' / 'digits_reward.py'}:digit_share"
pytestmark = pytest.mark.slow


def _cfg(model_dir, out, alerts, *, eta=2, steps=5):
    return build_config(
        {
            "run": {"output_dir": str(out), "seed": 2},
            "model": {"path": str(model_dir)},
            "data": {"task": "arith", "prompts_per_step": 2, "eval_size": 0, "train_size": 32},
            "rollout": {"n": 4, "max_new_tokens": 4},
            "reward": {"task_reward": False, "functions": [{"path": DIGITS}]},
            "algorithm": {"name": "decoupled_ppo"},
            "trainer": {"total_steps": steps, "lr": 1e-3},
            "architecture": {"mode": "decoupled", "staleness": eta, "num_workers": 1},
            "checkpoint": {"every": 0},
            "monitor": {
                "alerts": alerts,
                "eval_every": 0,
                "sample_every": 0,
                "tensorboard": False,
                "progress": False,
            },
        }
    )


def test_staleness_alerts_fire_and_stop_a_decoupled_run(tiny_model_dir, tmp_path):
    torch.set_num_threads(1)
    alerts = [
        "nan_loss",  # a skip rule: supported (vetoes inside the learner's update)
        "staleness",  # staleness/max above η = 2: the runtime never trains a sample that stale
        {"name": "fresh", "metric": "staleness/max", "kind": "below"},  # threshold η: fires at step 1 (lag 0)
        {"name": "lagging", "metric": "staleness/max", "kind": "above", "threshold": 0.5, "action": "stop"},
    ]
    cfg = _cfg(tiny_model_dir, tmp_path / "run", alerts)
    with pytest.raises(AlertStopError):
        train_decoupled(cfg, progress=False)
    rows = read_alerts(tmp_path / "run")
    by_rule = {r["rule"]: r for r in rows}
    assert set(by_rule) == {"fresh", "lagging"}, rows
    assert by_rule["fresh"]["step"] == 1 and "below 2" in by_rule["fresh"]["message"]
    stop = by_rule["lagging"]
    # Worker runs ahead (η = 2): the batch generated while the learner trains the previous one lags by 1.
    assert stop["action"] == "stop" and stop["value"] >= 1.0 and 2 <= stop["step"] <= 5
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["stopped_by_alert"] == stop["step"] == summary["steps"]
    assert summary["accounting"]["trained_batches"] == stop["step"]
    assert [int(p.name.split("-")[1]) for p in list_checkpoints(tmp_path / "run" / "checkpoints")] == [
        stop["step"]
    ]


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_rollback_with_fsdp2_restores_the_weight_average(lora, tiny_model_dir, tmp_path):
    """Decoupled, an FSDP2 learner on two ranks with a weight average: every rank keeps its shards of the
    average, which a run checkpoint's DCP folder holds beside the weights. The rule fires once, at step 5
    (the LR warms up past it, then runs at half); the rollback restores step 3's checkpoint and every rank
    reads its shards of the average back (check_average_restored on the replayed step 4). With LoRA the
    shards and the average hold the adapter only."""
    torch.set_num_threads(1)
    rule = {"metric": "actor/lr", "kind": "above", "threshold": 1.3e-3, "action": "rollback", "lr_scale": 0.5}
    data = _cfg(tiny_model_dir, tmp_path / "run", [rule], eta=0, steps=6).model_dump(mode="json")
    data["algorithm"] = {"name": "grpo"}
    data["trainer"].update(
        lr=2e-3, lr_schedule="constant", warmup_steps=8, world_size=2, strategy="fsdp2", ema_decay=0.9
    )
    data["checkpoint"] = {"every": 1, "keep_last": 9}
    if lora:
        data["model"]["lora"] = {"r": 4, "alpha": 8.0}
    cfg = build_config(data)
    result = train_decoupled(cfg, progress=False)
    alerts = read_alerts(tmp_path / "run")
    assert [(a["action"], a["step"]) for a in alerts] == [("rollback", 5)], alerts
    assert check_average_restored(tmp_path / "run", cfg) == 4
    assert result.steps == 6


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_rollback_with_two_learner_ranks(strategy, tiny_model_dir, tmp_path):
    """A decoupled run with a 2-rank learner rolls back (DDP: rank 0 restores the checkpoint and rank 1
    takes its state; FSDP2: each rank reads its shards, rank 0 publishes from them), the restored weights
    are published under a new version and the run finishes. The rule fires once by construction (the LR
    warms up past it, then runs at half)."""
    torch.set_num_threads(1)
    rule = {"metric": "actor/lr", "kind": "above", "threshold": 1.5e-3, "action": "rollback", "lr_scale": 0.5}
    data = _cfg(tiny_model_dir, tmp_path / "run", [rule], eta=0, steps=5).model_dump(mode="json")
    data["algorithm"] = {"name": "grpo"}
    data["trainer"].update(lr=2e-3, lr_schedule="constant", warmup_steps=2, world_size=2, strategy=strategy)
    data["checkpoint"] = {"every": 1, "keep_last": 6}
    result = train_decoupled(build_config(data), progress=False)
    alerts = read_alerts(tmp_path / "run")
    assert [a["action"] for a in alerts] == ["rollback"], alerts
    rows = read_metrics(tmp_path / "run")
    steps = [r["step"] for r in rows if r["step"] >= 1]
    assert len(steps) == 5 + alerts[0]["step"] and steps[-1] == 5  # the rolled-back steps ran again
    assert all(r["staleness/step_lag"] == 0.0 for r in rows if r["step"] >= 1)  # nothing pre-rollback trained
    assert result.steps == 5


def test_lr_x1000_rolls_a_decoupled_run_back_and_scales_lr(tiny_model_dir, tmp_path, monkeypatch):
    """As the colocated fault test: the update of step k runs with LR × 1000, the KL rule fires, the weights
    of a checkpoint from before the fault are restored and published to the worker under a new version,
    the replayed step runs at half the LR, and the run finishes."""
    torch.set_num_threads(1)
    k = 3
    restored = inject_lr_spike_and_spy_rollback(monkeypatch, k)
    rule = {"metric": "actor/kl", "kind": "above", "threshold": 1.0, "action": "rollback", "lr_scale": 0.5}
    cfg = _cfg(tiny_model_dir, tmp_path / "run", [rule], eta=0, steps=7).model_dump(mode="json")
    cfg["algorithm"] = {"name": "grpo", "beta": 0.04}
    cfg["checkpoint"] = {"every": 1, "keep_last": 4}
    result = train_decoupled(build_config(cfg), progress=False)
    check_rollback(tmp_path / "run", restored, k)
    rows = read_metrics(tmp_path / "run")
    assert all(r["staleness/step_lag"] == 0.0 for r in rows if r["step"] >= 1)  # nothing pre-rollback trained
    assert result.steps == 7 and (tmp_path / "run" / "summary.json").exists()
