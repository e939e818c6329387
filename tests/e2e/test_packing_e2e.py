"""End to end: a run with token-budget packing and gradient checkpointing trains (old and ref log-prob
scoring passes included) and logs the usual metrics."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from tandem.config import build_config
from tandem.models import load_causal_lm
from tandem.orchestration.runner import train
from tandem.train.checkpoint import latest_checkpoint

HERE = Path(__file__).parent


def test_packed_checkpointed_run_trains(tiny_model_dir, tmp_path):
    cfg = build_config(
        {
            "run": {"output_dir": str(tmp_path / "run"), "seed": 3},
            "model": {"path": str(tiny_model_dir)},
            "data": {"task": "arith", "prompts_per_step": 2, "eval_size": 4, "train_size": 64},
            "rollout": {"n": 4, "max_new_tokens": 4},
            "algorithm": {"name": "grpo", "beta": 0.05},
            "reward": {"task_reward": False, "functions": [{"path": f"{HERE / 'digits_reward.py'}:digit_share"}]},
            "trainer": {
                "total_steps": 2, "lr": 1e-3, "ppo_epochs": 2, "mini_batch_size": 4,
                "micro_batch_tokens": 24, "gradient_checkpointing": True,
            },
            "monitor": {"eval_every": 0, "sample_every": 1, "tensorboard": False, "progress": False},
        }
    )  # fmt: skip
    result = train(cfg, progress=False)
    assert result.steps == 2
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(math.isfinite(r["actor/pg_loss"]) for r in rows if r["step"] >= 1)
    before = load_causal_lm(tiny_model_dir).state_dict()
    after = load_causal_lm(latest_checkpoint(result.run_dir / "checkpoints") / "model").state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before), "weights did not change"
