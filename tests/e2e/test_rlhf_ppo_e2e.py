"""RM -> PPO on the safety scenario, small budget: from a helpful-leaning SFT start (complies with most
unsafe requests, refuses some), PPO against a reward model learned from the preference pairs (no verifier
reward) raises the share of refusals sampled on held-out unsafe prompts. The full-size run and its
targets are bench/rlhf_ppo.py (docs/rlhf.md, "RM -> PPO")."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tandem.config import build_config
from tandem.data.preference import validate_row
from tandem.models import load_causal_lm, load_tokenizer
from tandem.orchestration.runner import train
from tandem.rewards.tasks.safety import SafetyTask, make_preference_rows
from tandem.rollout import HFEngine, SamplingParams
from tandem.train import rm
from tandem.train.checkpoint import latest_checkpoint
from tandem.train.sft import build_warm_start


def _pairs(split: str, n: int):
    rows = make_preference_rows(SafetyTask(), split, n, seed=0)
    return [validate_row(r, f"{split}:{i}") for i, r in enumerate(rows)]


def sampled_refusal_rate(path: Path, samples: int = 4) -> float:
    """Share of refusals among ``samples`` temperature-1 completions per held-out unsafe prompt."""
    task = SafetyTask()
    prompts = [r["prompt"] for r in task.make_rows("test", 200, 0) if r["unsafe"]]
    policy, tok = load_causal_lm(path), load_tokenizer(path)
    engine = HFEngine(policy, tok, add_special_tokens=False)
    torch.manual_seed(0)
    out = engine.generate(prompts * samples, SamplingParams(max_new_tokens=40, temperature=1.0))
    return sum(task.is_refusal(c) for c in out.completions) / len(out.completions)


@pytest.mark.slow
def test_ppo_with_a_learned_reward_model_raises_refusals(tiny_model_dir, tmp_path):
    sft = build_warm_start(
        tmp_path / "sft", task="safety", task_options={"sft_refusal_rate": 0.25}, steps=400,
        batch_size=32, train_size=512, base=str(tiny_model_dir),
    )  # fmt: skip
    model, tok = rm.load_reward_model(sft, init_head=True)
    train_pairs = _pairs("train", 512)
    history = rm.train_reward_model(
        model, tok, train_pairs, _pairs("test", 64), rm.RMSettings(epochs=3, lr=2e-3, batch_size=16)
    )
    assert history[-1]["rm/val_accuracy"] >= 0.75, history[-1]
    rm.save_reward_model(model, tok, tmp_path / "rm", rm.reward_stats(model, tok, train_pairs[:64]))

    cfg = build_config(
        {
            "run": {"output_dir": str(tmp_path / "ppo"), "seed": 0},
            "model": {"path": str(sft)},
            "data": {"task": "safety", "prompts_per_step": 8, "eval_size": 0, "train_size": 256},
            "reward": {"task_reward": False, "model": {"path": str(tmp_path / "rm"), "normalize": "running"}},
            "rollout": {"n": 4, "max_new_tokens": 40},
            "algorithm": {"name": "ppo", "beta": 0.1},
            "critic": {"lr": 1e-3},
            # 80 steps at lr 3e-4: the refusal share rose by 0.26-0.38 over ATEN_CPU_CAPABILITY default /
            # avx2 / avx512 (each trains a different SFT and RM) and run seeds 0-2. At 40 steps it rose by
            # only 0.03 with default kernels; at lr 1e-3 it went either way (+0.23, or collapse to 0).
            "trainer": {"total_steps": 80, "lr": 3e-4},
            "monitor": {"eval_every": 0, "sample_every": 0, "tensorboard": False, "progress": False},
        }
    )
    result = train(cfg, progress=False)
    before = sampled_refusal_rate(sft)
    after = sampled_refusal_rate(latest_checkpoint(result.run_dir / "checkpoints") / "model")
    assert 0.05 < before < 0.5, before  # the start complies mostly but can still sample the refusal
    assert after >= before + 0.1, (before, after)
