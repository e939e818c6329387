"""``algorithm.kl.ref_sync_steps`` on a two-rank learner (DDP and FSDP2): every rank moves its copy of the
KL reference alike, so the run measures the same KL as one process; a resumed two-rank run hands rank 0's
restored (moved) reference to the other rank. With α = 1 the reference is reset to the policy after
step 2, so step 3's KL is measured against the weights that sampled its batch (η = 0): a rank still holding
the start's reference would add its rows' KL against the start."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import safetensors.torch
import torch
from run_checks import step_rows

from tandem.config import build_config
from tandem.orchestration.decoupled.runtime import RunHooks, train_decoupled
from tandem.train.checkpoint import REFERENCE_WEIGHTS, checkpoint_dir

DIGITS = f"{Path(__file__).parents[1] / 'e2e' / 'digits_reward.py'}:digit_share"


def _cfg(model_dir, out, world_size, strategy):
    return build_config(
        {
            "run": {"output_dir": str(out), "seed": 5},
            "model": {"path": str(model_dir)},
            "data": {"task": "arith", "prompts_per_step": 2, "eval_size": 0, "train_size": 16},
            "rollout": {"n": 4, "max_new_tokens": 4},
            "algorithm": {"name": "grpo", "beta": 0.5, "kl": {"ref_sync_steps": 2, "ref_sync_alpha": 1.0}},
            "reward": {"task_reward": False, "functions": [{"path": DIGITS}]},
            "trainer": {
                "total_steps": 3,
                "lr": 1e-2,
                "lr_schedule": "constant",
                "strategy": strategy,
                "shared_prefix": False,
                "micro_batch_size": 2,
            },
            "architecture": {"mode": "decoupled", "staleness": 0, "learner": {"world_size": world_size}},
            "checkpoint": {"every": 1, "keep_last": 5},
            "monitor": {"eval_every": 0, "sample_every": 0, "tensorboard": False, "progress": False},
        }
    )


def _kl(run_dir):
    return [(r["step"], r["actor/kl_ref"]) for r in step_rows(run_dir)]


@pytest.fixture(scope="module")
def one_process(tiny_model_dir, tmp_path_factory):
    torch.set_num_threads(1)
    return train_decoupled(
        _cfg(tiny_model_dir, tmp_path_factory.mktemp("ref_one"), 1, "auto"), progress=False
    ).run_dir


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_two_ranks_move_the_reference_as_one_process(one_process, tiny_model_dir, tmp_path, strategy):
    torch.set_num_threads(1)
    sharded: list[bool] = []

    def on_step(run, step):  # FSDP2: the moving reference is sharded like the policy, and moves its shards
        learn = run.learner.learn
        sharded.append(getattr(learn.dp, "reference", None) is learn.ref_model)

    hooks = RunHooks(on_step)
    two = train_decoupled(
        _cfg(tiny_model_dir, tmp_path / "two", 2, strategy), progress=False, hooks=hooks
    ).run_dir
    assert sharded == [strategy == "fsdp2"] * 3
    # step 3 runs against the reset reference on both ranks: its KL is the one process's
    assert [s for s, _ in _kl(two)] == [1, 2, 3]
    for (_, a), (_, b) in zip(_kl(two), _kl(one_process), strict=True):
        assert a == pytest.approx(b, rel=1e-3, abs=1e-7)
    ref = safetensors.torch.load_file(checkpoint_dir(two / "checkpoints", 2) / REFERENCE_WEIGHTS)
    want = safetensors.torch.load_file(checkpoint_dir(one_process / "checkpoints", 2) / REFERENCE_WEIGHTS)
    for name in want:
        torch.testing.assert_close(ref[name], want[name], rtol=1e-4, atol=1e-6)

    # killed after step 2's checkpoint (after the reset), resumed on two ranks: rank 1 gets the reset
    # reference from rank 0 and step 3 repeats the uninterrupted run's KL
    halves = tmp_path / "halves"
    shutil.copytree(two, halves)
    shutil.rmtree(checkpoint_dir(halves / "checkpoints", 3))
    (halves / "summary.json").unlink()
    cfg = _cfg(tiny_model_dir, halves, 2, strategy)
    resumed = train_decoupled(cfg, resume=True, progress=False).run_dir
    assert _kl(resumed)[-1][0] == 3
    assert _kl(resumed)[-1][1] == pytest.approx(_kl(two)[-1][1], rel=1e-5, abs=1e-9)
