"""``tandem tune`` end to end on a tiny model: the rung plan runs, the best of rung 0 is the one promoted,
best.yaml is a valid config with the winner's overrides; bad input is one line. (Mechanism, not outcome.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tandem.cli.main import app
from tandem.config import load_config


def _config(tmp_path: Path, model_dir: Path) -> Path:
    data = {
        "run": {"name": "t", "seed": 0},
        "model": {"path": str(model_dir)},
        "data": {"task": "arith", "prompts_per_step": 2, "train_size": 8, "eval_size": 4},
        "rollout": {"n": 2, "max_new_tokens": 2},
        "trainer": {"total_steps": 2, "lr": 1e-3},
    }
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_tune_runs_the_plan_and_writes_the_best_config(tiny_model_dir, tmp_path) -> None:
    cfg = _config(tmp_path, tiny_model_dir)
    out = tmp_path / "tune"
    args = ["tune", str(cfg), "--budget", "4", "--min-steps", "1", "--out", str(out)]
    result = CliRunner().invoke(app, [*args, "--space", "trainer.lr=1e-3,3e-3"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (out / "tune.jsonl").read_text().splitlines()]
    assert [(r["trial"], r["steps"]) for r in rows[:2]] == [(0, 1), (1, 1)] and rows[2]["steps"] == 2
    first = max(rows[:2], key=lambda r: (r["eval/accuracy"], -r["trial"]))
    assert rows[2]["trial"] == first["trial"]  # the better first-rung run is the one trained longer
    best = load_config(out / "best.yaml")
    winner = rows[2]["overrides"][0].split("=")[1]
    assert best.trainer.lr == float(winner)
    assert best.trainer.total_steps == 2  # the config's length, not the rung's
    assert {p.name for p in out.iterdir() if p.is_dir()} == {"00001-1e-3", "00001-3e-3", f"00002-{winner}"}
    assert "tune (2 candidates)" in result.output and "4/4" in result.output  # the sweep's bar: 1+1+2 steps


def test_tune_bad_space_and_small_budget_are_one_line(tiny_model_dir, tmp_path) -> None:
    cfg = _config(tmp_path, tiny_model_dir)
    bad = CliRunner().invoke(app, ["tune", str(cfg), "--space", "trainer.lr", "--out", str(tmp_path / "a")])
    assert bad.exit_code == 2 and "--space 'trainer.lr' is not KEY=V1,V2" in bad.output
    small = CliRunner().invoke(app, ["tune", str(cfg), "--budget", "1", "--out", str(tmp_path / "b")])
    assert small.exit_code == 2 and "too small for 6 candidates" in small.output
    decoupled = [str(cfg), "architecture.mode=decoupled", "--budget", "1", "--out", str(tmp_path / "d")]
    dec = CliRunner().invoke(app, ["tune", *decoupled])  # adaptive group size runs decoupled too
    assert dec.exit_code == 2 and "too small for 6 candidates" in dec.output
    dyn = [str(cfg), "algorithm.dynamic_sampling=true", "--budget", "1", "--out", str(tmp_path / "e")]
    left = CliRunner().invoke(app, ["tune", *dyn])  # a default dimension the config cannot take is left out
    assert left.exit_code == 2 and "too small for 3 candidates" in left.output
    assert "leaving out algorithm.adaptive_group.enabled" in left.output and "dynamic_sampling" in left.output
    key = CliRunner().invoke(
        app, ["tune", str(cfg), "--space", "trainer.lrr=1", "--out", str(tmp_path / "c")]
    )
    assert key.exit_code == 2 and "trainer.lrr" in key.output
    assert not any((tmp_path / d).exists() for d in "abcde")


def test_default_space_is_relative_to_the_configs_learning_rate() -> None:
    from tandem.cli.tune import default_space

    space = default_space(3e-4)
    assert [float(v) for v in space["trainer.lr"]] == pytest.approx([1e-4, 3e-4, 9e-4])
    assert [float(v) for v in default_space(1e-6)["trainer.lr"]] == pytest.approx([3.33e-7, 1e-6, 3e-6])
    assert space["algorithm.adaptive_group.enabled"] == ["false", "true"]
