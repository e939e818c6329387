"""vLLM with a LoRA policy: the engine holds a plain model and must receive the merged weights (under the
base model's names) at start and after every update, colocated and in a short training run.

Skipped where vLLM or PEFT cannot be imported. Uses the quickstart warm start (head size 32: vLLM's CPU
kernels need >= 32)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from run_checks import step_rows

from tandem.config import build_config
from tandem.config.model import ModelConfig
from tandem.errors import ConfigError
from tandem.models import load_tokenizer, response_logprobs
from tandem.models.lora import merged_model
from tandem.orchestration.build import build_policy
from tandem.orchestration.colocated import EngineWeights
from tandem.orchestration.runner import train
from tandem.rollout import EngineSpec, SamplingParams, build_engine
from tandem.rollout.registry import EngineUnavailableError, engine_class

ROOT = Path(__file__).resolve().parents[2]
WARM = ROOT / "checkpoints" / "quickstart-warmstart"
PROMPTS = ["12+7=", "3+45=", "60+21=", "9+9="]
GREEDY = SamplingParams(max_new_tokens=6, temperature=0.0)

try:
    engine_class("vllm")
    import peft  # noqa: F401

    SKIP = None
except (EngineUnavailableError, ConfigError, ImportError) as err:
    SKIP = str(err)
pytestmark = pytest.mark.skipif(SKIP is not None, reason=f"vLLM or PEFT not importable: {SKIP}")


def _one_lora_update(policy, tokenizer) -> None:
    """One AdamW step on the adapter that makes the policy prefer other answers (lr large on purpose: the
    greedy outputs must change, so a stale engine would be caught)."""
    enc = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    target = tokenizer(["77\n"] * len(PROMPTS), return_tensors="pt", add_special_tokens=False)["input_ids"]
    opt = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=0.05)
    policy.train()
    mask = torch.ones_like(target, dtype=torch.bool)
    lp, _ = response_logprobs(policy, enc["input_ids"], enc["attention_mask"].bool(), target, mask)
    (-lp.sum()).backward()
    opt.step()
    policy.eval()


def test_vllm_receives_the_merged_weights_of_a_lora_policy():
    torch.manual_seed(0)
    policy, tokenizer = build_policy(ModelConfig(path=str(WARM), lora={"r": 8, "alpha": 16.0}))
    vllm = build_engine("vllm", EngineSpec(path=str(WARM), model=policy, tokenizer=tokenizer))
    try:
        base_out = vllm.generate(PROMPTS, GREEDY)  # a fresh adapter: the base model
        _one_lora_update(policy, tokenizer)
        EngineWeights(vllm).publish(policy, 1)
        hf = build_engine("hf", EngineSpec(model=merged_model(policy), tokenizer=load_tokenizer(WARM)))
        got, want = vllm.generate(PROMPTS, GREEDY), hf.generate(PROMPTS, GREEDY)
        assert not torch.equal(got.behavior_logprobs, base_out.behavior_logprobs)  # the update landed
        assert torch.equal(got.response_ids, want.response_ids) and got.completions == want.completions
        torch.testing.assert_close(got.behavior_logprobs, want.behavior_logprobs, atol=1e-4, rtol=0)
        assert got.policy_version.tolist() == [1] * len(PROMPTS)
    finally:
        vllm.close()


def test_colocated_lora_training_keeps_vllm_on_the_trainers_weights(tmp_path):
    torch.set_num_threads(1)
    cfg = build_config(
        {
            "run": {"output_dir": str(tmp_path / "run"), "seed": 1},
            "model": {"path": str(WARM), "lora": {"r": 8, "alpha": 16.0}},
            "data": {
                "task": "arith",
                "task_options": {"digits": 2, "ops": "+"},
                "prompts_per_step": 4,
                "eval_size": 16,
                "train_size": 64,
            },
            "rollout": {"n": 4, "max_new_tokens": 6, "temperature": 1.0, "backend": "vllm"},
            "algorithm": {"name": "grpo", "beta": 0.02},
            "trainer": {"total_steps": 3, "lr": 1e-2},
            "monitor": {"eval_every": 3, "sample_every": 0, "tensorboard": False, "progress": False},
            "checkpoint": {"save_final": False},
        }
    )
    result = train(cfg, progress=False)
    rows = step_rows(result.run_dir)
    assert len(rows) == 3
    for r in rows:  # what vLLM sampled with is what the trainer's LoRA policy recomputes, every step
        assert r["rollout/logprob_diff_max"] < 1e-3 and r["rollout/ratio_outside_frac"] == 0.0, r
        assert r["perf/weight_sync_bytes"] > 0
    assert "eval/accuracy" in result.eval_after
