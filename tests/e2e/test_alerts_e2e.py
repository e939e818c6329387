"""Fault injection, one test per rule: the matching alert fires within 2 steps and its action takes effect.

- NaN loss at step k -> ``skip``: the optimiser step is dropped (and any ``skip`` rule really vetoes updates).
- LR × 1000 at step k -> KL to the reference explodes -> ``rollback``: weights restored from a checkpoint
  that predates the fault, LR scaled down, the run finishes.
- Response length doubles (the length series injected into the real loop, so the test does not depend on
  where training lands) -> ``length_blowup`` warns once per incident: logged and POSTed to a webhook on
  127.0.0.1, through ``tandem train``.
- Train reward climbs while the held-out score drops -> ``reward_hacking`` ``stop``: checkpoint, exit 3.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import torch
from run_checks import check_rollback, inject_lr_spike_and_spy_rollback
from safetensors.torch import load_file
from typer.testing import CliRunner

import tandem.orchestration.colocated as colocated_mod
import tandem.train.update as update_mod
from tandem.cli.main import app
from tandem.config import build_config, config_to_yaml
from tandem.monitor import read_metrics
from tandem.monitor.alerts import read_alerts
from tandem.orchestration.colocated import ColocatedTrainer
from tandem.orchestration.runner import train
from tandem.train.checkpoint import list_checkpoints

HERE = Path(__file__)
TASK = {"min_len": 2, "max_len": 3}  # the options tests/e2e/conftest.py trains warm_model on


_CALLS = [0]


def climbing_reward(prompts, completions, **columns):
    """A train reward that climbs every step regardless of the answers."""
    _CALLS[0] += 1
    return [min(1.0, 0.1 * _CALLS[0])] * len(completions)


def _cfg(model, out, alerts, **sections):
    data = {
        "run": {"name": "alerts", "output_dir": str(out), "seed": 0},
        "model": {"path": str(model)},
        "data": {"task": "reverse", "task_options": TASK, "prompts_per_step": 4, "eval_size": 8},
        "rollout": {"n": 4, "max_new_tokens": 8},
        "trainer": {"total_steps": 6, "lr": 1e-3},
        "monitor": {
            "alerts": alerts,
            "eval_every": 0,
            "sample_every": 1,
            "tensorboard": False,
            "progress": False,
        },
        "checkpoint": {"every": 1, "keep_last": 4},
    }
    for key, value in sections.items():
        data.setdefault(key, {}).update(value)
    return build_config(data)


def _count_optimizer_steps(monkeypatch) -> list[int]:
    calls = [0]
    orig = torch.optim.AdamW.step

    def step(self, *a, **kw):
        calls[0] += 1
        return orig(self, *a, **kw)

    monkeypatch.setattr(torch.optim.AdamW, "step", step)
    return calls


def test_nan_loss_at_step_k_skips_that_update(warm_model, tmp_path, monkeypatch):
    k = 3
    orig, seen = update_mod.policy_loss, [0]

    def nan_at_k(*args, **kwargs):
        loss, metrics = orig(*args, **kwargs)
        seen[0] += 1
        if seen[0] == k:  # one loss call per step here (1 epoch, 1 mini-batch, 1 micro-batch)
            return loss * float("nan"), {**metrics, "pg_loss": torch.tensor(float("nan"))}
        return loss, metrics

    monkeypatch.setattr(update_mod, "policy_loss", nan_at_k)
    steps = _count_optimizer_steps(monkeypatch)
    out = tmp_path / "run"
    train(_cfg(warm_model, out, ["nan_loss"]), progress=False)
    (alert,) = read_alerts(out)
    assert alert["rule"] == "nan_loss" and alert["step"] == k and alert["effect"] == "update skipped"
    row = next(r for r in read_metrics(out) if r["step"] == k)
    assert row["actor/skipped_by_alert"] == 1.0
    assert steps[0] == 6 - 1


def test_skip_action_vetoes_optimizer_step(warm_model, tmp_path, monkeypatch):
    """A skip rule on a finite metric (so only the alert can be the reason): no update ever lands."""
    steps = _count_optimizer_steps(monkeypatch)
    rule = {"metric": "actor/grad_norm", "kind": "above", "threshold": -1.0, "action": "skip"}
    out = tmp_path / "run"
    train(_cfg(warm_model, out, [rule], trainer={"total_steps": 3}), progress=False)
    assert steps[0] == 0
    assert [a["step"] for a in read_alerts(out)] == [1, 2, 3]
    final = load_file(str(list_checkpoints(out / "checkpoints")[-1] / "model" / "model.safetensors"))
    start = load_file(str(Path(warm_model) / "model.safetensors"))
    for key, value in start.items():
        torch.testing.assert_close(final[key], value, rtol=0, atol=0)


def test_lr_x1000_at_step_k_rolls_back_and_scales_lr(warm_model, tmp_path, monkeypatch):
    k = 4  # the update of step k runs with LR × 1000
    restored = inject_lr_spike_and_spy_rollback(monkeypatch, k)
    rule = {"metric": "actor/kl", "kind": "above", "threshold": 1.0, "action": "rollback", "lr_scale": 0.5}
    out = tmp_path / "run"
    cfg = _cfg(warm_model, out, [rule], algorithm={"beta": 0.04}, trainer={"total_steps": 8, "lr": 1e-3})
    result = train(cfg, progress=False)
    alerts = check_rollback(out, restored, k)  # LR after the rollback: half the replayed step's earlier LR
    assert result.steps == 8 and (out / "summary.json").exists()
    assert len(alerts) == 1  # healthy again after the rollback


class _Hook(BaseHTTPRequestHandler):
    received: list = []

    def do_POST(self):  # noqa: N802 - http.server API
        self.received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_length_blowup_warns_once_per_incident_and_posts_webhook(warm_model, tmp_path, monkeypatch):
    """The response lengths the rule watches are injected (where a real run would get there by training on
    a reward that pays for length): they double at step 5, fall back at 6 and double again at 7 and 8.
    The warn rule fires on each rising edge, through the CLI, into alerts.jsonl and the webhook."""
    series = [4.0, 4.0, 5.0, 7.0, 9.0, 5.0, 10.0, 12.0]  # base = mean of the first 2 = 4; fires above 8
    real = colocated_mod.rollout_metrics

    def injected(batch, gen_seconds):
        metrics = real(batch, gen_seconds)
        metrics["response/length_mean"] = series[injected.calls]
        injected.calls += 1
        return metrics

    injected.calls = 0
    monkeypatch.setattr(colocated_mod, "rollout_metrics", injected)
    _Hook.received = []
    server = HTTPServer(("127.0.0.1", 0), _Hook)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        rule = {"name": "length_blowup", "metric": "response/length_mean", "kind": "growth"}
        rule |= {"threshold": 2.0, "min_history": 2, "action": "warn"}
        out = tmp_path / "run"
        cfg = _cfg(
            warm_model,
            out,
            [rule],
            trainer={"total_steps": len(series)},
            monitor={"alert_webhook": f"http://127.0.0.1:{server.server_port}/alerts"},
        )
        config = tmp_path / "cfg.yaml"
        config.write_text(config_to_yaml(cfg))
        res = CliRunner().invoke(app, ["train", str(config), "--no-progress"])
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    assert res.exit_code == 0, res.output
    assert [r["response/length_mean"] for r in read_metrics(out) if r["step"] >= 1] == series
    alerts = read_alerts(out)
    assert [(a["step"], a["value"]) for a in alerts] == [(5, 9.0), (7, 10.0)]  # rising edges only
    assert all(a["rule"] == "length_blowup" and a["effect"] == "logged" for a in alerts)
    assert [p["step"] for p in _Hook.received] == [5, 7]
    assert _Hook.received[0]["run"] == "alerts" and _Hook.received[0]["action"] == "warn"
    assert "grew > 2" in _Hook.received[0]["message"]


def test_heldout_drop_while_train_reward_climbs_stops_with_checkpoint(warm_model, tmp_path, monkeypatch):
    k = 4  # the frozen held-out score starts to drop at step k

    def frozen_heldout(self):
        v = 0.6 if self.step < k else 0.6 - 0.15 * (self.step - k + 1)
        return {"eval/reward_mean": v, "eval/accuracy": v}

    monkeypatch.setattr(ColocatedTrainer, "evaluate", frozen_heldout)
    _CALLS[0] = 0
    out = tmp_path / "run"
    cfg = _cfg(
        warm_model,
        out,
        [{**_preset("reward_hacking"), "action": "stop"}],
        reward={"task_reward": False, "functions": [{"path": f"{HERE}:climbing_reward"}]},
        monitor={"eval_every": 1},
        trainer={"total_steps": 10},
    )
    config = tmp_path / "cfg.yaml"
    config.write_text(config_to_yaml(cfg))
    res = CliRunner().invoke(app, ["train", str(config), "--no-progress"])
    assert res.exit_code == 3, res.output
    assert "stopped by an alert at step" in res.output
    (alert,) = read_alerts(out)
    assert alert["rule"] == "reward_hacking" and k <= alert["step"] <= k + 1
    assert int(list_checkpoints(out / "checkpoints")[-1].name.split("-")[1]) == alert["step"]
    assert json.loads((out / "summary.json").read_text())["stopped_by_alert"] == alert["step"]


def _preset(name):
    from tandem.config.schema import ALERT_PRESETS

    return {"name": name, **ALERT_PRESETS[name]}
