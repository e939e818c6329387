"""End to end: reward functions see the run's progress (``trainer_state``), in training and held-out
evaluation, in both architectures, and ``tandem eval`` of a model the run kept passes them the state the
run evaluated it at; ``async def`` functions score like plain ones."""

from __future__ import annotations

import json

import pytest

from tandem.config import build_config
from tandem.evaluate.runner import run_eval
from tandem.orchestration.runner import train

REWARDS = '''
import asyncio


async def progress(prompts, completions, trainer_state, **kwargs):
    """A schedule's input, as a score: the steps done before the batch is learned from."""
    await asyncio.sleep(0)
    assert trainer_state.max_steps == 3
    return [float(trainer_state.global_step) + trainer_state.epoch / 100] * len(completions)
'''


@pytest.mark.parametrize("mode", ["colocated", "decoupled"])
def test_reward_functions_see_the_step(tiny_model_dir, tmp_path, mode):
    rows = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(8)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "rewards.py").write_text(REWARDS)
    cfg = build_config(
        {
            "run": {"output_dir": str(tmp_path / "run"), "seed": 0},
            "model": {"path": str(tiny_model_dir)},
            "data": {
                "task": None,
                "train_file": str(tmp_path / "train.jsonl"),
                "eval_file": str(tmp_path / "train.jsonl"),
                "prompts_per_step": 2,
            },
            "reward": {"task_reward": False, "functions": [{"path": f"{tmp_path / 'rewards.py'}:progress"}]},
            "rollout": {"n": 2, "max_new_tokens": 3},
            "architecture": {"mode": mode, "staleness": 0},
            "trainer": {"total_steps": 3, "lr": 1e-3},
            "monitor": {"eval_every": 1, "sample_every": 0, "tensorboard": False, "progress": False},
            # best/ keeps the lowest score: the step-0 model (the score grows with the step)
            "checkpoint": {"every": 2, "best_metric": "eval/reward_mean", "best_mode": "min"},
        }
    )
    result = train(cfg, progress=False)
    lines = (result.run_dir / "metrics.jsonl").read_text().splitlines()
    rows_out = [json.loads(line) for line in lines]
    trained = {r["step"]: r["reward/mean"] for r in rows_out if "reward/mean" in r}
    evaluated = {r["step"]: r["eval/reward_mean"] for r in rows_out if "eval/reward_mean" in r}
    # step s's batch was drawn after s - 1 steps and 2 * (s - 1) of the 8 prompts
    assert trained == pytest.approx({s: s - 1 + (s - 1) * 2 / 8 / 100 for s in (1, 2, 3)})
    assert evaluated and evaluated == pytest.approx({s: s + s * 2 / 8 / 100 for s in evaluated})
    # `tandem eval` of what the run kept scores as the run's evaluation of it did
    run = result.run_dir
    for target, step in ((run, 3), (run / "checkpoints" / "step-00000002", 2), (run / "best", 0)):
        metrics = run_eval(target, samples=0)["metrics"]
        assert metrics["eval/reward_mean"] == pytest.approx(evaluated.get(step, 0.0)), target
