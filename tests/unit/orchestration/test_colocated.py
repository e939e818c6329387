"""The colocated step around a fake engine: dynamic sampling refills with informative groups only."""

from __future__ import annotations

from pathlib import Path

import torch

from tandem.config import build_config
from tandem.orchestration.colocated import ColocatedTrainer
from tandem.orchestration.parts import build_parts
from tandem.orchestration.rollout_step import step_seed
from tandem.types import RolloutBatch

DIGITS = Path(__file__).parents[2] / "e2e" / "digits_reward.py"


class ScriptedEngine:
    """Fake engine (unit test only): answers each prompt with a scripted list of completions."""

    def __init__(self, answers_per_round: list[list[str]]):
        self.rounds = list(answers_per_round)
        self.version = 0
        self.calls = 0

    def update_weights(self, state_dict, version):
        self.version = version

    def generate(self, prompts, params, *, group_offset=0, extras=None, on_chunk=None, chunk_tokens=4):
        answers = self.rounds[min(self.calls, len(self.rounds) - 1)]
        self.calls += 1
        B = len(prompts) * params.n
        R = 2
        return RolloutBatch(
            prompt_ids=torch.full((B, 3), 5),
            prompt_mask=torch.ones(B, 3, dtype=torch.bool),
            response_ids=torch.full((B, R), 6),
            response_mask=torch.ones(B, R, dtype=torch.bool),
            behavior_logprobs=torch.full((B, R), -1.0),
            group_ids=torch.arange(len(prompts)).repeat_interleave(params.n) + group_offset,
            policy_version=torch.full((B,), self.version),
            prompts=[p for p in prompts for _ in range(params.n)],
            completions=[answers[i % len(answers)] for i in range(B)],
            finish_reasons=["stop"] * B,
            extras=[e for e in (extras or [{}] * len(prompts)) for _ in range(params.n)],
        )


def _trainer(tiny_model_dir, tmp_path, engine, **algo):
    cfg = build_config(
        {
            "run": {"output_dir": str(tmp_path)},
            "model": {"path": str(tiny_model_dir)},
            "data": {"task": "arith", "prompts_per_step": 2, "eval_size": 0, "train_size": 32},
            "rollout": {"n": 2, "max_new_tokens": 2},
            "algorithm": {"name": "dapo", **algo},
            "reward": {"task_reward": False, "functions": [{"path": f"{DIGITS}:digit_share"}]},
        }
    )
    parts = build_parts(cfg)
    parts.engine = engine
    return ColocatedTrainer(parts)


def test_dynamic_sampling_drops_uninformative_groups_and_refills(tiny_model_dir, tmp_path):
    # Round 0: every sample identical (no signal) -> all dropped; round 1: digits vs letters -> kept.
    engine = ScriptedEngine([["ab"], ["12", "ab"]])
    trainer = _trainer(tiny_model_dir, tmp_path, engine)
    batch, scores, metrics = trainer.collect()
    assert engine.calls == 2
    assert batch.batch_size == 4 and scores.tolist() == [1.0, 0.0, 1.0, 0.0]
    assert metrics["dapo/rounds"] == 2 and metrics["dapo/kept_frac"] == 0.5


def test_dynamic_sampling_gives_up_after_max_rounds(tiny_model_dir, tmp_path):
    engine = ScriptedEngine([["ab"]])
    trainer = _trainer(tiny_model_dir, tmp_path, engine, max_resample_rounds=2)
    metrics = trainer.train_step()
    assert engine.calls == 3
    assert metrics["dapo/kept_frac"] == 0.0
    assert "actor/pg_loss" not in metrics  # nothing informative: no update this step
    assert trainer.step == 1 and engine.version == 1


def test_step_seed_differs_per_step_and_round():
    seeds = {step_seed(0, s, r) for s in range(50) for r in range(3)}
    assert len(seeds) == 150
