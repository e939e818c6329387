"""End to end: PPO with a shared-backbone value head (critic.shared_backbone) trains policy and head in one
backward, checkpoints the head beside a plain policy folder, resumes exactly, warms the head up alone."""

from __future__ import annotations

from pathlib import Path

import safetensors.torch
import torch
from run_checks import step_rows

from tandem.config import build_config
from tandem.models import load_causal_lm
from tandem.orchestration.runner import train
from tandem.train.checkpoint import latest_checkpoint

HERE = Path(__file__).parent
DIGITS = {"task_reward": False, "functions": [{"path": f"{HERE / 'digits_reward.py'}:digit_share"}]}
CRITIC_KEYS = ("critic/vf_loss", "critic/vf_clipfrac", "critic/explained_var", "critic/values_mean")


def _cfg(tiny_model_dir, out, **sections):
    data = {
        "run": {"output_dir": str(out), "seed": 3},
        "model": {"path": str(tiny_model_dir)},
        "data": {"task": "arith", "prompts_per_step": 2, "eval_size": 4, "train_size": 64},
        "reward": DIGITS,
        "rollout": {"n": 4, "max_new_tokens": 4},
        "algorithm": {"name": "ppo", "beta": 0.05},
        "critic": {"lr": 1e-3, "shared_backbone": True},
        "trainer": {"total_steps": 2, "lr": 1e-3},
        "monitor": {"eval_every": 0, "sample_every": 0, "tensorboard": False, "progress": False},
    }
    for key, value in sections.items():
        data.setdefault(key, {}).update(value)
    return build_config(data)


def _policy(path):
    return {k: v.clone() for k, v in load_causal_lm(path).state_dict().items()}


def _head(ckpt):
    return safetensors.torch.load_file(str(ckpt / "critic" / "model.safetensors"))


def always_one(prompts, completions, **columns):
    """A constant reward: every return is ~1 (less the small KL penalty), a fixed target for the head."""
    return [1.0] * len(completions)


def test_shared_head_ppo_trains_and_checkpoints_a_plain_policy(tiny_model_dir, tmp_path):
    # A constant reward gives the head a fixed target far from its near-zero start, so "the head fits the
    # returns" does not depend on how noisy each step's digit-share returns happen to be (with those, the
    # value loss of step 5 vs step 1 went either way between run seeds).
    cfg = _cfg(
        tiny_model_dir,
        tmp_path / "run",
        reward={"task_reward": False, "functions": [{"path": f"{Path(__file__)}:always_one"}]},
        critic={"lr": 1e-2, "value_clip": None},
        trainer={"total_steps": 6, "ppo_epochs": 2, "mini_batch_size": 4},
    )
    result = train(cfg, progress=False)
    ckpt = latest_checkpoint(result.run_dir / "checkpoints")
    assert ckpt is not None
    head = _head(ckpt)
    assert set(head) == {"head.weight", "head.bias"}  # the head alone, not a second copy of the policy
    assert not (ckpt / "critic" / "optimizer.pt").exists()  # its Adam state is in the policy optimizer
    assert torch.load(ckpt / "optimizer.pt", weights_only=True)["param_groups"][-1]["params"]
    model_files = {p.name for p in (ckpt / "model").iterdir()}
    assert "model.safetensors" in model_files and not any("value" in n or "critic" in n for n in model_files)
    policy_keys = set(safetensors.torch.load_file(str(ckpt / "model" / "model.safetensors")))
    assert not any(k.startswith("head.") for k in policy_keys)
    before, after = _policy(tiny_model_dir), _policy(ckpt / "model")  # loads strictly as a plain causal LM
    assert any(not torch.equal(before[k], after[k]) for k in before), "policy did not change"
    rows = step_rows(result.run_dir)
    for key in CRITIC_KEYS:
        assert all(key in r for r in rows), key
    assert "critic/grad_norm" not in rows[-1]  # no separate critic step after warm-up
    vf = [r["critic/vf_loss"] for r in rows]
    values = [r["critic/values_mean"] for r in rows]
    # the head fits the returns within a few steps (run seeds 0-3: the last 3 steps' mean value loss is
    # 0.05-0.07 of the first step's; the mean value goes from -0.1..0.12 to 0.84-1.06)
    assert sum(vf[-3:]) / 3 < vf[0] / 4, vf
    assert abs(values[-1] - 1.0) < abs(values[0] - 1.0) / 2, values


def test_shared_head_warmup_leaves_the_policy_unchanged(tiny_model_dir, tmp_path):
    cfg = _cfg(tiny_model_dir, tmp_path / "run", critic={"lr": 1e-3, "warmup_steps": 2})
    result = train(cfg, progress=False)
    ckpt = latest_checkpoint(result.run_dir / "checkpoints")
    before, after = _policy(tiny_model_dir), _policy(ckpt / "model")
    for k in before:
        torch.testing.assert_close(after[k], before[k], rtol=0, atol=0)
    rows = step_rows(result.run_dir)
    assert all(r["actor/critic_warmup"] == 1.0 and "critic/vf_loss" in r for r in rows)
    first = rows[0]["critic/values_mean"]
    assert rows[1]["critic/values_mean"] != first, "the head did not learn during warm-up"


def test_shared_head_resume_is_exact(tiny_model_dir, tmp_path, crash_at_step):
    common = {
        "trainer": {"total_steps": 4, "lr": 1e-3, "ppo_epochs": 2, "mini_batch_size": 4},
        "checkpoint": {"every": 2, "keep_last": 5},
        "critic": {"lr": 1e-3, "warmup_steps": 1},
    }
    full = train(_cfg(tiny_model_dir, tmp_path / "full", **common), progress=False)
    crash_at_step(_cfg(tiny_model_dir, tmp_path / "part", **common), 2)
    resumed = train(_cfg(tiny_model_dir, tmp_path / "part", **common), resume=True, progress=False)
    assert resumed.steps == 4
    ck_full = latest_checkpoint(full.run_dir / "checkpoints")
    ck_res = latest_checkpoint(resumed.run_dir / "checkpoints")
    for a, b in ((_policy(ck_full / "model"), _policy(ck_res / "model")), (_head(ck_full), _head(ck_res))):
        for k in a:
            torch.testing.assert_close(b[k], a[k], rtol=0, atol=0)
    keys = ("reward/mean", "actor/pg_loss", "critic/vf_loss", "critic/explained_var")

    def trace(run):
        return [tuple(r.get(k) for k in keys) for r in step_rows(run.run_dir)]

    assert trace(resumed) == trace(full)
