"""An encoder reward model end to end: ``tandem rm`` trains a tiny BERT (built locally, WordPiece
vocabulary) from its base folder, then a 3-step GRPO run of a char-level Llama policy scores every
completion with it through ``reward.model`` — the policy's text re-tokenised with the RM's tokenizer.
Mechanism only: nothing asserts what the RL run learns."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import yaml
from run_checks import step_rows
from typer.testing import CliRunner

from tandem.cli.main import app
from tandem.config import build_config
from tandem.models.encoder import build_tiny_encoder
from tandem.orchestration.runner import train

ROOT = Path(__file__).resolve().parents[2]
WORDS = ["apple", "river", "stone", "cloud", "paper", "light", "green", "seven"]


def _write_prefs(path: Path, n: int, offset: int) -> list[str]:
    """Pairs learnable by construction (chosen ends in 'good', rejected in 'bad'); returns their text."""
    rows = []
    for i in range(n):
        body = " ".join(WORDS[(i + offset + k) % len(WORDS)] for k in range(1 + i % 3))
        rows.append({"prompt": f"What is {i}+{offset}?", "chosen": f"{body} good", "rejected": f"{body} bad"})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return [f"{r['prompt']} {r['chosen']} {r['rejected']}" for r in rows]


def test_tandem_rm_trains_an_encoder_and_grpo_scores_with_it(tmp_path):
    torch.set_num_threads(1)
    texts = _write_prefs(tmp_path / "train.jsonl", 48, 0) + _write_prefs(tmp_path / "val.jsonl", 16, 100)
    base = build_tiny_encoder(tmp_path / "bert", texts + ["0123456789 + = ?"], arch="bert")
    cfg = tmp_path / "rm.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "model": str(base),
                "out_dir": str(tmp_path / "rm"),
                "data": {
                    "train_file": str(tmp_path / "train.jsonl"),
                    "val_file": str(tmp_path / "val.jsonl"),
                },
                "epochs": 8,
                "lr": 3e-3,
                "batch_size": 16,
            }
        )
    )
    result = CliRunner().invoke(app, ["rm", str(cfg)])
    assert result.exit_code == 0, result.output
    assert "encoder" in result.output and "held-out acc" in result.output
    stats = json.loads((tmp_path / "rm" / "tandem_reward.json").read_text())
    assert stats["history"][-1]["rm/val_accuracy"] > 0.9 and stats["std"] > 0
    run = build_config(
        {
            "run": {"output_dir": str(tmp_path / "run"), "seed": 3},
            "model": {"path": str(ROOT / "checkpoints" / "quickstart-warmstart")},
            "data": {"task": "arith", "prompts_per_step": 2, "eval_size": 0, "train_size": 16},
            "rollout": {"n": 2, "max_new_tokens": 6},
            "algorithm": {"name": "grpo"},
            "trainer": {"total_steps": 3, "lr": 1e-4},
            "reward": {"model": {"path": str(tmp_path / "rm"), "weight": 0.5, "normalize": "fixed"}},
            "monitor": {"eval_every": 0, "sample_every": 0, "tensorboard": False, "progress": False},
            "checkpoint": {"save_final": False},
        }
    )
    rows = step_rows(train(run, progress=False).run_dir)
    assert len(rows) == 3
    keys = [k for k in rows[-1] if "reward_model" in k]
    assert keys, sorted(rows[-1])
    assert all(math.isfinite(r[k]) for r in rows for k in keys)
