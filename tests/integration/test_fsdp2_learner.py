"""A decoupled run with a two-rank FSDP2 learner (``trainer.strategy: fsdp2``): it trains 3 steps with the
policy sharded over the ranks, publishes the gathered weights, writes run checkpoints whose optimiser state
is a DCP folder of the ranks' shards, and a one-process learner resumes from them.
Mechanism only: what a step computes is checked against one process in tests/unit/train/test_fsdp.py."""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import warnings
import weakref
from pathlib import Path

import pytest
import torch
from run_checks import step_rows
from torch.distributed.tensor import DTensor

from tandem.config import build_config
from tandem.models import load_causal_lm
from tandem.orchestration.build import build_policy
from tandem.orchestration.decoupled.runtime import RunHooks, train_decoupled
from tandem.train.checkpoint import latest_checkpoint
from tandem.train.fsdp import FullyShardedDataParallel, load_sharded
from tandem.train.optim import build_optimizer

DIGITS = f"{Path(__file__).parents[1] / 'e2e' / 'digits_reward.py'}:digit_share"


def _cfg(model_dir, out, world_size, strategy, total_steps):
    return build_config(
        {
            "run": {"output_dir": str(out), "seed": 5},
            "model": {"path": str(model_dir)},
            "data": {"task": "arith", "prompts_per_step": 2, "eval_size": 2, "train_size": 16},
            "rollout": {"n": 4, "max_new_tokens": 4},
            "algorithm": {"name": "grpo"},
            "reward": {"task_reward": False, "functions": [{"path": DIGITS}]},
            "trainer": {
                "total_steps": total_steps,
                "lr": 3e-3,
                "strategy": strategy,
                "shared_prefix": False,
                "micro_batch_size": 2,
            },
            "architecture": {"mode": "decoupled", "staleness": 0, "learner": {"world_size": world_size}},
            "checkpoint": {"every": 2},
            "monitor": {"eval_every": 0, "sample_every": 0, "tensorboard": False, "progress": False},
        }
    )


@pytest.fixture(scope="module")
def fsdp2_run(tiny_model_dir, tmp_path_factory):
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("fsdp2_run")
    seen: set[int] = set()
    strategies: list[str] = []

    plain_bytes: list[int] = []
    # parameters alive before the run (another test's model this worker process still holds) are not the
    # run's: weak references, so only objects still alive are excluded, never a new one reusing an id
    before = [weakref.ref(p) for p in _plain_parameters()]

    def on_step(run, step):
        seen.update(p.pid for p in mp.active_children() if p.name.startswith("tandem-learner-rank"))
        strategies.append(type(run.learner.learn.dp).__name__)
        plain_bytes.append(
            _plain_policy_bytes(run.learner.learn, {id(o) for w in before if (o := w()) is not None})
        )

    res = train_decoupled(_cfg(tiny_model_dir, out, 2, "fsdp2", 3), progress=False, hooks=RunHooks(on_step))
    return out, res, seen, strategies, plain_bytes


def _plain_parameters() -> list[torch.nn.Parameter]:
    """Every plain (not DTensor) parameter alive in this process."""
    gc.collect()
    with warnings.catch_warnings():  # isinstance on every object touches deprecated torch aliases
        warnings.simplefilter("ignore", FutureWarning)
        return [
            o for o in gc.get_objects() if isinstance(o, torch.nn.Parameter) and not isinstance(o, DTensor)
        ]


def _plain_policy_bytes(learn, earlier: set[int]) -> int:
    """Storage bytes of every plain parameter alive in this process other than the reference model's and
    those alive before the run (ids ``earlier``): rank 0 of a decoupled FSDP2 learner should hold none (its
    policy is sharded, no copy is kept; FSDP2's own unsharded-parameter placeholders are alive but their
    storage is freed between forwards, size 0)."""
    ref = set() if learn.ref_model is None else {id(p) for p in learn.ref_model.parameters()}
    storages = {
        p.untyped_storage().data_ptr(): p.untyped_storage().nbytes()
        for p in _plain_parameters()
        if id(p) not in ref and id(p) not in earlier
    }
    return sum(storages.values())


def test_fsdp2_learner_trains_three_steps_and_checkpoints(fsdp2_run, tiny_model_dir):
    out, res, seen, strategies, plain_bytes = fsdp2_run
    assert res.steps == 3
    assert plain_bytes == [0, 0, 0]  # rank 0 keeps no unsharded policy (publish/eval/checkpoint gather)
    before, after = res.eval_before, res.last_metrics
    assert "eval/accuracy" in before and "eval/accuracy" in after  # evaluated on transient gathered copies
    assert strategies == [FullyShardedDataParallel.__name__] * 3
    assert len(seen) == 1
    for pid in seen:  # joined and gone
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not torch.distributed.is_initialized()
    rows = step_rows(res.run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["actor/grad_norm"] > 0 for r in rows)
    # The run checkpoint holds the optimiser state as DCP shards, one file per rank (rank 0's plain
    # optimiser never steps and is not saved); read whole in one process: 3 AdamW steps, non-zero moments.
    ckpt = latest_checkpoint(res.run_dir / "checkpoints")
    assert ckpt is not None and not (ckpt / "optimizer.pt").exists()
    assert len(list((ckpt / "sharded").glob("*.distcp"))) == 2
    cfg = _cfg(tiny_model_dir, out, 1, "auto", 3)
    model, _ = build_policy(cfg.model, seed=0)
    optimizer = build_optimizer(model, cfg.trainer)
    load_sharded(ckpt / "sharded", model, optimizer, whole=True)
    state = list(optimizer.state.values())
    assert len(state) == len(list(model.parameters())) and all(float(s["step"]) == 3.0 for s in state)
    assert all(float(s["exp_avg"].abs().max()) > 0 for s in state)
    # model/ was written from a transient copy gathered from the shards: the same weights as the shards
    saved = dict(load_causal_lm(ckpt / "model").named_parameters())
    for name, p in model.named_parameters():
        assert torch.equal(saved[name], p), name


def test_one_process_resumes_an_fsdp2_run(fsdp2_run, tiny_model_dir):
    """Another world size: one process resumes the fsdp2 run's checkpoint and trains a 4th step."""
    torch.set_num_threads(1)
    out, *_ = fsdp2_run
    resumed = train_decoupled(_cfg(tiny_model_dir, out, 1, "auto", 4), resume=True, progress=False)
    assert resumed.steps == 4
    assert [r["step"] for r in step_rows(resumed.run_dir)][-1] == 4
