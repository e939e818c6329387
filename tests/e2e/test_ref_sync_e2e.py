"""``algorithm.kl.ref_sync_steps``: the KL reference moves towards the policy every N steps, checkpoints
keep the moved reference, a resume restores it exactly, and configs that cannot move it are refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import safetensors.torch
import torch

from tandem.config import build_config
from tandem.errors import ConfigError
from tandem.models import init_tiny_model, load_causal_lm
from tandem.orchestration.runner import train
from tandem.train.checkpoint import REFERENCE_WEIGHTS, checkpoint_dir

HERE = Path(__file__).parent


def _cfg(tiny_model_dir, out, *, steps=4, sync=2, alpha=1.0, **sections):
    data = {
        "run": {"output_dir": str(out), "seed": 3},
        "model": {"path": str(tiny_model_dir)},
        "data": {"task": "arith", "prompts_per_step": 2, "eval_size": 0, "train_size": 64},
        "rollout": {"n": 4, "max_new_tokens": 4},
        "algorithm": {"name": "grpo", "beta": 0.05, "kl": {"ref_sync_steps": sync, "ref_sync_alpha": alpha}},
        "trainer": {"total_steps": steps, "lr": 1e-2},
        "checkpoint": {"every": 1, "keep_last": 10},
        "monitor": {"eval_every": 0, "sample_every": 0, "tensorboard": False, "progress": False},
        # every group has some spread, so the weights move
        "reward": {"task_reward": False, "functions": [{"path": f"{HERE / 'digits_reward.py'}:digit_share"}]},
    }
    for key, value in sections.items():
        data.setdefault(key, {}).update(value)
    return build_config(data)


def _params(path) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in load_causal_lm(path).named_parameters()}


def _rows(run) -> list[dict]:
    rows = [json.loads(x) for x in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["step"] >= 1]


@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_reference_moves_to_the_policy_every_n_steps(tiny_model_dir, tmp_path, alpha):
    run = train(_cfg(tiny_model_dir, tmp_path / "run", alpha=alpha), progress=False)
    ckpts = run.run_dir / "checkpoints"
    start = _params(tiny_model_dir)
    expected = start
    for step in (1, 2, 3, 4):
        ref = safetensors.torch.load_file(checkpoint_dir(ckpts, step) / REFERENCE_WEIGHTS)
        policy = _params(checkpoint_dir(ckpts, step) / "model")
        if step % 2 == 0:  # the step's update, then the move
            expected = {n: expected[n] + alpha * (policy[n] - expected[n]) for n in expected}
        assert ref.keys() == expected.keys()
        for n in ref:
            torch.testing.assert_close(ref[n], expected[n], rtol=1e-6, atol=1e-7)
        assert any(not torch.equal(ref[n], start[n]) for n in ref) == (step >= 2)
    assert [r.get("actor/ref_synced") for r in _rows(run)] == [None, 1.0, None, 1.0]


def test_resume_restores_the_moved_reference(tiny_model_dir, tmp_path, crash_at_step):
    full = train(_cfg(tiny_model_dir, tmp_path / "full", alpha=0.6), progress=False)
    crash_at_step(_cfg(tiny_model_dir, tmp_path / "part", alpha=0.6), 2)  # after step 2's move
    resumed = train(_cfg(tiny_model_dir, tmp_path / "part", alpha=0.6), resume=True, progress=False)
    assert resumed.steps == 4

    def kl(run):
        return [(r["step"], r["actor/kl_ref"], r["actor/pg_loss"]) for r in _rows(run)]

    assert kl(resumed) == kl(full)  # step 3's KL is measured against the moved reference
    last = checkpoint_dir(full.run_dir / "checkpoints", 4)
    for name in ("model", REFERENCE_WEIGHTS):
        a = checkpoint_dir(resumed.run_dir / "checkpoints", 4) / name
        wa = _params(a) if name == "model" else safetensors.torch.load_file(a)
        wb = _params(last / name) if name == "model" else safetensors.torch.load_file(last / name)
        for n in wb:
            torch.testing.assert_close(wa[n], wb[n], rtol=0, atol=0)


def test_configs_that_cannot_move_the_reference_are_refused(tiny_model_dir, tmp_path):
    with pytest.raises(ConfigError, match="algorithm.beta is 0"):
        _cfg(tiny_model_dir, tmp_path / "a", algorithm={"beta": 0.0})
    with pytest.raises(ConfigError, match="LoRA policy.s reference"):
        _cfg(tiny_model_dir, tmp_path / "b", model={"lora": {"r": 4}})
    other = init_tiny_model(tmp_path / "wide", hidden_size=48, num_layers=2, num_heads=2, seed=1)
    with pytest.raises(ConfigError, match="model.ref_path: algorithm.kl.ref_sync_steps needs a reference of"):
        train(_cfg(tiny_model_dir, tmp_path / "d", model={"ref_path": str(other)}), progress=False)
    assert not (tmp_path / "d").exists()  # refused before the run folder is written
