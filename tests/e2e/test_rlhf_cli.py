"""RLHF end to end through the CLI on tiny models: generate the safety preference set, validate /
split / stats / dedup / aggregate it, train a reward model and use it as an RL reward, run DPO
(reference cached, verifier score before/after), label with the rule judge; bad input ends in one line
and exit 2."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from console import TANDEM
from typer.testing import CliRunner

from tandem.cli.main import app

runner = CliRunner()


def invoke(*args: str):
    result = runner.invoke(app, [str(a) for a in args])
    return result


@pytest.fixture(scope="module")
def prefs(tmp_path_factory):
    root = tmp_path_factory.mktemp("prefs")
    result = invoke(
        "data", "make-safety", "--out-dir", root, "--train-size", "48", "--val-size", "16", "--noise", "0.25"
    )
    assert result.exit_code == 0, result.output
    return root


def test_make_safety_noise_only_in_train(prefs):
    train = [json.loads(x) for x in (prefs / "train.jsonl").read_text().splitlines()]
    val = [json.loads(x) for x in (prefs / "val.jsonl").read_text().splitlines()]
    assert len(train) == 48 and 4 < sum(r["flipped"] for r in train) < 20
    assert not any(r["flipped"] for r in val)
    assert {r["prompt"] for r in train}.isdisjoint({r["prompt"] for r in val})


def test_data_commands(prefs, tmp_path):
    bad = tmp_path / "bad.jsonl"
    lines = (prefs / "val.jsonl").read_text().splitlines()[:3] + [
        '{"prompt": "p", "chosen": "x", "rejected": "x"}'
    ]
    bad.write_text("\n".join(lines) + "\n")
    result = invoke("data", "validate", bad)
    assert result.exit_code == 2 and f"{bad}:4: 'chosen' and 'rejected' are identical" in result.output
    result = invoke("data", "validate", bad, "--skip-invalid")
    assert result.exit_code == 0 and "3 valid pairs, 1 invalid rows" in result.output
    assert json.loads((tmp_path / "bad.invalid.jsonl").read_text())["where"] == f"{bad}:4"
    result = invoke("data", "stats", prefs / "train.jsonl")
    assert (
        result.exit_code == 0 and "category unsafe" in result.output and "distinct prompts" in result.output
    )
    result = invoke(
        "data", "split", prefs / "train.jsonl", "--out-dir", tmp_path / "split", "--val-fraction", "0.25"
    )
    assert result.exit_code == 0, result.output
    tr = {json.loads(x)["prompt"] for x in (tmp_path / "split/train.jsonl").read_text().splitlines()}
    va = {json.loads(x)["prompt"] for x in (tmp_path / "split/val.jsonl").read_text().splitlines()}
    assert tr and va and tr.isdisjoint(va)
    result = invoke("data", "dedup", prefs / "train.jsonl", "--out", tmp_path / "dd.jsonl")
    assert result.exit_code == 0 and "exact" in result.output
    ann = tmp_path / "ann.jsonl"
    ann.write_text(
        json.dumps({"prompt": "p", "response_a": "x", "response_b": "y", "annotations": ["a", "a", "b"]})
        + "\n"
    )
    result = invoke("data", "aggregate", ann, "--out", tmp_path / "agg.jsonl")
    assert result.exit_code == 0 and "Fleiss' kappa" in result.output and "kept 1 pairs" in result.output


def test_rm_then_reward_model_in_an_rl_config(prefs, tiny_model_dir, tmp_path):
    cfg = tmp_path / "rm.yaml"
    out = tmp_path / "rm"
    cfg.write_text(
        yaml.safe_dump(
            {
                "model": str(tiny_model_dir),
                "out_dir": str(out),
                "data": {"train_file": str(prefs / "train.jsonl"), "val_file": str(prefs / "val.jsonl")},
                "epochs": 2,
                "batch_size": 16,
            }
        )
    )
    result = invoke("rm", cfg)
    assert result.exit_code == 0, result.output
    assert "held-out acc" in result.output and (out / "tandem_reward.json").is_file()
    stats = json.loads((out / "tandem_reward.json").read_text())
    assert [h["epoch"] for h in stats["history"]] == [1.0, 2.0]
    from tandem.config import load_config
    from tandem.orchestration.build import build_rewards

    rl = tmp_path / "rl.yaml"
    rl.write_text(
        yaml.safe_dump(
            {
                "data": {"task": "safety"},
                "model": {"path": str(tiny_model_dir)},
                "reward": {"model": {"path": str(out), "weight": 0.5}},
            }
        )
    )
    rl_cfg = load_config(rl)
    rewards = build_rewards(rl_cfg.reward, task=None)
    assert [f.name for f in rewards.functions] == ["reward_model"]
    run = {
        "run": {"output_dir": str(tmp_path / "run"), "seed": 0},
        "model": {"path": str(tiny_model_dir)},
        "data": {"task": "safety", "prompts_per_step": 2, "train_size": 8, "eval_size": 2},
        "rollout": {"n": 2, "max_new_tokens": 3},
        "trainer": {"total_steps": 2, "lr": 1e-3},
        "reward": {"task_reward": True, "model": {"path": str(out), "weight": 0.5, "normalize": "fixed"}},
        "monitor": {"eval_every": 0, "sample_every": 0, "tensorboard": False, "progress": False},
    }
    rl.write_text(yaml.safe_dump(run))
    result = invoke("train", rl)
    assert result.exit_code == 0, result.output
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any("reward_model" in k for k in rows[-1]), sorted(rows[-1])
    result = invoke("rm", cfg, "epochs=0")
    assert result.exit_code == 2 and "override 'epochs=0': epochs:" in result.output


def test_dpo_cli_caches_reference(prefs, tiny_model_dir, tmp_path):
    cfg = tmp_path / "dpo.yaml"
    out = tmp_path / "runs" / "dpo"  # out_dir may be new, its parent too (docs/serving.md's recipe: runs/v2)
    cfg.write_text(
        yaml.safe_dump(
            {
                "model": str(tiny_model_dir),
                "out_dir": str(out),
                "data": {"train_file": str(prefs / "train.jsonl"), "val_fraction": 0.25},
                "batch_size": 8,
                "max_steps": 3,
                "eval_task": "safety",
                "eval_size": 4,
            }
        )
    )
    result = invoke("dpo", cfg)
    assert result.exit_code == 0, result.output
    assert "rewards/accuracies" in result.output and "verifier accuracy" in result.output
    assert (out / "config.json").is_file() and Path(str(out) + ".ref_logps.safetensors").is_file()


def test_label_cli_rule_judge_with_noise(prefs, tmp_path):
    rows = tmp_path / "rows.jsonl"
    with rows.open("w") as fh:
        for i, line in enumerate((prefs / "val.jsonl").read_text().splitlines()):
            r = json.loads(line)
            a, b = (r["chosen"], r["rejected"]) if i % 2 else (r["rejected"], r["chosen"])
            fh.write(
                json.dumps(
                    {
                        "prompt": r["prompt"],
                        "response_a": a,
                        "response_b": b,
                        "answer": r["answer"],
                        "gold": "a" if i % 2 else "b",
                    }
                )
                + "\n"
            )
    cfg = tmp_path / "label.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "input_file": str(rows),
                "out_file": str(tmp_path / "labelled.jsonl"),
                "judge": "rule",
                "rule": "task:safety",
            }
        )
    )
    result = invoke("label", cfg)
    assert result.exit_code == 0, result.output
    assert (
        "label accuracy, swap-consistent" in result.output
        and len((tmp_path / "labelled.jsonl").read_text().splitlines()) == 16
    )
    again = invoke("label", cfg)
    assert "resumed" in again.output and "│ resumed" in again.output and "16" in again.output
    # out_file is rewritten whole: never the input, never a file label did not write
    unrelated = tmp_path / "notes.jsonl"
    unrelated.write_text('{"keep": 1}\n')
    for target, message in ((rows, "is the input"), (unrelated, "is not an earlier tandem label output")):
        before = target.read_text()
        refused = invoke("label", cfg, f"out_file={target}")
        assert refused.exit_code == 2 and message in " ".join(refused.output.split()), refused.output
        assert target.read_text() == before


def test_rm_invalid_rows_name_the_config_key_that_skips_them(prefs, tiny_model_dir, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text((prefs / "train.jsonl").read_text() + '{"prompt": "p", "chosen": "a"}\n')
    cfg = tmp_path / "rm.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {"model": str(tiny_model_dir), "out_dir": str(tmp_path / "rm"), "data": {"train_file": str(bad)}}
        )
    )
    result = invoke("rm", cfg)
    assert (
        result.exit_code == 2
        and "data.skip_invalid=true" in result.output
        and "--skip-invalid" not in result.output
    )


def test_console_script_prints_one_line_and_exits_2(tmp_path):
    missing = tmp_path / "nope.jsonl"
    proc = subprocess.run(
        [*TANDEM, "data", "validate", str(missing)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2 and proc.stderr.strip() == f"error: {missing}: preference file does not exist"
    assert "Traceback" not in proc.stderr


def test_online_dpo_cli(prefs, tiny_model_dir, tmp_path):
    cfg = tmp_path / "online.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "model": str(tiny_model_dir),
                "out_dir": str(tmp_path / "online"),
                "data": {"train_file": str(prefs / "train.jsonl"), "val_fraction": 0.25},
                "batch_size": 8,
                "online_rounds": 2,
                "online_judge": "task:safety",
                "online_max_new_tokens": 4,
            }
        )  # fmt: skip
    )
    result = invoke("dpo", cfg)
    assert result.exit_code == 0, result.output
    assert "online DPO" in result.output and (tmp_path / "online" / "config.json").is_file()
    assert not Path(str(tmp_path / "online") + ".ref_logps.safetensors").exists()
    result = invoke("dpo", cfg, "online_judge=null")
    assert result.exit_code == 2 and "online_judge" in result.output
