"""Decoupled with η = 0 and one worker reproduces the colocated run (same seed): rewards and weights.

Exactness argument: ticket k draws the colocated step-k prompts, sampling seed and group ids; the worker's
model copy receives the learner's fp32 weights bit for bit through shared memory before each batch; both
sides run with one torch thread, so every forward pass (sampling, log-probs, update) does the same float
operations in the same order. Hence equality is asserted exactly, not within a tolerance.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tandem.config import build_config
from tandem.models import load_causal_lm
from tandem.orchestration.decoupled.runtime import train_decoupled
from tandem.orchestration.runner import train
from tandem.train.checkpoint import latest_checkpoint

# A dense reward (share of digits) gives every group some spread, so the updates are non-trivial.
DIGITS = f"{Path(__file__).parents[1] / 'e2e' / 'digits_reward.py'}:digit_share"


def _cfg(model_dir, out, mode, **arch):
    return build_config(
        {
            "run": {"output_dir": str(out), "seed": 5},
            "model": {"path": str(model_dir)},
            "data": {"task": "arith", "prompts_per_step": 2, "eval_size": 4, "train_size": 32},
            "rollout": {"n": 4, "max_new_tokens": 4},
            "algorithm": {"name": "grpo"},
            "reward": {"task_reward": False, "functions": [{"path": DIGITS}]},
            "trainer": {"total_steps": 3, "lr": 3e-3},
            "architecture": {"mode": mode, **arch},
            "monitor": {"eval_every": 0, "sample_every": 0, "tensorboard": False, "progress": False},
        }
    )


def _rows(run_dir):
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["step"] >= 1]


def _weights(run_dir):
    return load_causal_lm(latest_checkpoint(run_dir / "checkpoints") / "model").state_dict()


def test_eta0_one_worker_equals_colocated(tiny_model_dir, tmp_path):
    torch.set_num_threads(1)
    colo = train(_cfg(tiny_model_dir, tmp_path / "colo", "colocated"), progress=False)
    dec = train_decoupled(
        _cfg(tiny_model_dir, tmp_path / "dec", "decoupled", staleness=0, num_workers=1), progress=False
    )
    assert dec.steps == colo.steps == 3
    a, b = _rows(colo.run_dir), _rows(dec.run_dir)
    for ra, rb in zip(a, b, strict=True):
        assert ra["reward/mean"] == rb["reward/mean"]
        assert ra["actor/pg_loss"] == rb["actor/pg_loss"]
        assert ra["response/length_mean"] == rb["response/length_mean"]
        assert rb["staleness/step_lag"] == 0.0
    wa, wb = _weights(colo.run_dir), _weights(dec.run_dir)
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    # the weights did move, so the equality is not vacuous
    w0 = load_causal_lm(tiny_model_dir).state_dict()
    assert any(not torch.equal(w0[k], wb[k]) for k in w0)
    assert colo.eval_after == dec.eval_after
