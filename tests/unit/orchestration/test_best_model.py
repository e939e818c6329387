"""``checkpoint.best_metric``: the run keeps the model of its best evaluation in ``<run>/best/``.

The evaluations are scripted (``Trainer.evaluate`` patched), so the test checks the mechanism — which step
wins, that ``best/`` holds that step's weights, resume, ``min`` mode, bad configs — not where training lands.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from tandem.config import build_config
from tandem.errors import ConfigError
from tandem.models import load_causal_lm
from tandem.monitor import read_metrics
from tandem.orchestration.best import BEST_RECORD, BestModel
from tandem.orchestration.runner import train
from tandem.orchestration.trainer import Trainer
from tandem.train.checkpoint import checkpoint_dir

DIGITS = f"{Path(__file__).parents[2] / 'e2e' / 'digits_reward.py'}:digit_share"


def _cfg(model_dir, out, steps=6, **checkpoint):
    return build_config(
        {
            "run": {"output_dir": str(out), "seed": 3},
            "model": {"path": str(model_dir)},
            "data": {"task": "arith", "prompts_per_step": 2, "eval_size": 4, "train_size": 32},
            "rollout": {"n": 2, "max_new_tokens": 3},
            "algorithm": {"name": "grpo"},
            "reward": {"task_reward": False, "functions": [{"path": DIGITS}]},
            "trainer": {"total_steps": steps, "lr": 3e-3},
            "checkpoint": {"every": 1, "keep_last": 10, "best_metric": "eval/accuracy", **checkpoint},
            "monitor": {"eval_every": 1, "sample_every": 0, "tensorboard": False, "progress": False},
        }
    )


def _script(monkeypatch, values):
    """Trainer.evaluate returns ``values`` in order (the step-0 evaluation first)."""
    calls = iter(values)
    monkeypatch.setattr(Trainer, "evaluate", lambda self: {"eval/accuracy": next(calls)})


def _weights(folder):
    return load_causal_lm(folder).state_dict()


def _same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_best_folder_holds_the_weights_of_the_best_evaluation(tiny_model_dir, tmp_path, monkeypatch):
    torch.set_num_threads(1)
    _script(monkeypatch, [0.10, 0.20, 0.50, 0.30, 0.50, 0.40, 0.45])  # steps 0..6; step 4 ties step 2
    res = train(_cfg(tiny_model_dir, tmp_path / "run"), progress=False)
    best = res.run_dir / "best"
    record = json.loads((best / BEST_RECORD).read_text())
    # trainer_state: what reward functions saw in that evaluation (2 steps of 2 of the 32 training prompts)
    state = {"global_step": 2, "max_steps": 6, "epoch": 0.125}
    assert record == {
        "step": 2,
        "metric": "eval/accuracy",
        "mode": "max",
        "value": 0.5,
        "trainer_state": state,
    }
    step2 = _weights(checkpoint_dir(res.run_dir / "checkpoints", 2) / "model")
    assert _same(_weights(best), step2)  # a ready Hugging Face folder: the step-2 policy
    assert not _same(step2, _weights(checkpoint_dir(res.run_dir / "checkpoints", 6) / "model"))
    summary = json.loads((res.run_dir / "summary.json").read_text())
    assert summary["best"] == {**record, "path": str(best)}
    assert [r["eval/accuracy"] for r in read_metrics(res.run_dir)] == [
        0.10,
        0.20,
        0.50,
        0.30,
        0.50,
        0.40,
        0.45,
    ]
    assert not list(res.run_dir.glob(".best*")), "no temp folder left behind"


def test_with_a_weight_average_best_holds_the_average_of_that_step(tiny_model_dir, tmp_path, monkeypatch):
    """``trainer.ema_decay``: ``best/`` and each checkpoint's ``model/`` hold the weights that were
    evaluated, the average; the live weights only sit in the checkpoint's ``live.safetensors``."""
    import safetensors.torch

    from tandem.train.checkpoint import LIVE_WEIGHTS

    torch.set_num_threads(1)
    _script(monkeypatch, [0.10, 0.20, 0.50, 0.30, 0.40])  # steps 0..4: step 2 wins
    cfg = _cfg(tiny_model_dir, tmp_path / "run", steps=4).model_dump(mode="json")
    cfg["trainer"]["ema_decay"] = 0.5
    res = train(build_config(cfg), progress=False)
    step2 = checkpoint_dir(res.run_dir / "checkpoints", 2)
    best, average = _weights(res.run_dir / "best"), _weights(step2 / "model")
    assert _same(best, average)
    live = safetensors.torch.load_file(str(step2 / LIVE_WEIGHTS))
    assert live.keys() <= average.keys()
    assert any(not torch.equal(live[k], average[k]) for k in live), "the average should lag the live weights"


def test_resumed_run_competes_against_the_best_it_kept(tiny_model_dir, tmp_path, monkeypatch):
    torch.set_num_threads(1)
    out = tmp_path / "run"

    class CrashError(Exception):
        pass

    _script(monkeypatch, [0.1, 0.6, 0.2, 0.3])
    real_log = Trainer.train_step

    def crash_after_3(self):
        if self.step == 3:
            raise CrashError
        return real_log(self)

    monkeypatch.setattr(Trainer, "train_step", crash_after_3)
    with pytest.raises(CrashError):
        train(_cfg(tiny_model_dir, out), progress=False)
    assert json.loads((out / "best" / BEST_RECORD).read_text())["step"] == 1
    monkeypatch.setattr(Trainer, "train_step", real_log)
    _script(monkeypatch, [0.55, 0.7, 0.65])  # steps 4, 5, 6: only step 5 beats the kept 0.6
    res = train(_cfg(tiny_model_dir, out), resume=True, progress=False)
    record = json.loads((res.run_dir / "best" / BEST_RECORD).read_text())
    assert (record["step"], record["value"]) == (5, 0.7)
    step5 = _weights(checkpoint_dir(res.run_dir / "checkpoints", 5) / "model")
    assert _same(_weights(res.run_dir / "best"), step5)


def test_min_mode_nan_and_ties():
    best = BestModel(Path("/nonexistent"), "eval/loss", "min")
    assert best.candidate({"reward/mean": 1.0}) is None  # a row without an evaluation
    assert best.candidate({"eval/loss": math.nan}) is None
    assert best.candidate({"eval/loss": 2.0}) == 2.0
    best.record = {"step": 1, "metric": "eval/loss", "mode": "min", "value": 2.0}
    assert best.candidate({"eval/loss": 2.0}) is None  # a tie keeps the earlier model
    assert best.candidate({"eval/loss": 3.0}) is None
    assert best.candidate({"eval/loss": 1.5}) == 1.5


def test_config_errors_name_the_key(tiny_model_dir, tmp_path):
    with pytest.raises(ConfigError, match=r"checkpoint\.best_metric.*held-out metric"):
        _cfg(tiny_model_dir, tmp_path, best_metric="reward/mean")
    data = _cfg(tiny_model_dir, tmp_path).model_dump(mode="json")
    data["data"]["eval_size"] = 0
    with pytest.raises(ConfigError, match=r"checkpoint\.best_metric.*data\.eval_size is 0"):
        build_config(data)
    with pytest.raises(ConfigError, match=r"checkpoint\.best_mode"):
        _cfg(tiny_model_dir, tmp_path, best_mode="highest")
