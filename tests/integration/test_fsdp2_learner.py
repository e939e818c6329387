"""A decoupled run with a two-rank FSDP2 learner (``trainer.strategy: fsdp2``): it trains 3 steps with the
policy sharded over the ranks, publishes the gathered weights, writes run checkpoints whose optimiser state
is a DCP folder of the ranks' shards, and a one-process learner resumes from them. With a weight average
(``trainer.ema_decay``) every rank keeps its shards of it: ``model/`` is the whole average, gathered, equal
to a one-process run's, and a two-rank resume restarts it exactly.
Mechanism only: what a step computes is checked against one process in tests/unit/train/test_fsdp.py."""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import shutil
import warnings
import weakref
from pathlib import Path

import pytest
import safetensors.torch
import torch
from run_checks import step_rows
from torch.distributed.tensor import DTensor

from tandem.config import build_config
from tandem.models import load_causal_lm
from tandem.orchestration.build import build_critic, build_policy
from tandem.orchestration.decoupled.runtime import RunHooks, train_decoupled
from tandem.train.checkpoint import LIVE_WEIGHTS, checkpoint_dir, latest_checkpoint, load_checkpoint
from tandem.train.fsdp import FullyShardedDataParallel, load_sharded
from tandem.train.optim import build_optimizer

DIGITS = f"{Path(__file__).parents[1] / 'e2e' / 'digits_reward.py'}:digit_share"


def _cfg(model_dir, out, world_size, strategy, total_steps, model=None, beta=0.0, critic=None, **trainer):
    return build_config(
        {
            **({"critic": critic} if critic else {}),
            "run": {"output_dir": str(out), "seed": 5},
            "model": {"path": str(model_dir), **(model or {})},
            "data": {"task": "arith", "prompts_per_step": 2, "eval_size": 2, "train_size": 16},
            "rollout": {"n": 4, "max_new_tokens": 4},
            "algorithm": {"name": "ppo" if critic else "grpo", "beta": beta},
            "reward": {"task_reward": False, "functions": [{"path": DIGITS}]},
            "trainer": {
                "total_steps": total_steps,
                "lr": 3e-3,
                "strategy": strategy,
                "shared_prefix": False,
                "micro_batch_size": 2,
                **trainer,
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


@pytest.fixture(scope="module")
def ema_runs(tiny_model_dir, tmp_path_factory):
    """A weight average, 4 steps (checkpoints at 2 and 4): one process, two FSDP2 ranks, and the two-rank
    run resumed on two ranks from its step-2 checkpoint."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("fsdp2_ema")
    ema = {"ema_decay": 0.5, "lr_schedule": "constant"}  # the same schedule for a leg of a resumed run

    def run(name, world_size, strategy, **kw):
        cfg = _cfg(tiny_model_dir, root / name, world_size, strategy, 4, **ema)
        return train_decoupled(cfg, progress=False, **kw).run_dir

    one, straight = run("one", 1, "auto"), run("straight", 2, "fsdp2")
    shutil.copytree(straight, root / "halves")
    shutil.rmtree(checkpoint_dir(root / "halves" / "checkpoints", 4))
    (root / "halves" / "summary.json").unlink()
    halves = run("halves", 2, "fsdp2", resume=True)
    return {
        "one": one,
        "straight": straight,
        "halves": halves,
        "cfg": _cfg(tiny_model_dir, root, 1, "auto", 4),
    }


def _model(run_dir, step):
    folder = checkpoint_dir(run_dir / "checkpoints", step) / "model"
    return {n: p.detach() for n, p in load_causal_lm(folder).named_parameters()}


def _live(run_dir, step, cfg):
    """The live weights: ``live.safetensors`` (one process) or the DCP shards read whole (FSDP2)."""
    ckpt = checkpoint_dir(run_dir / "checkpoints", step)
    if (ckpt / LIVE_WEIGHTS).exists():
        return safetensors.torch.load_file(ckpt / LIVE_WEIGHTS)
    model, _ = build_policy(cfg.model, seed=0)
    load_sharded(ckpt / "sharded", model, build_optimizer(model, cfg.trainer), whole=True)
    return {n: p.detach() for n, p in model.named_parameters()}


def test_two_fsdp2_ranks_gather_the_one_process_weight_average(ema_runs):
    one, two, cfg = ema_runs["one"], ema_runs["straight"], ema_runs["cfg"]
    assert [r["actor/ema_decay"] for r in step_rows(two)] == [0.5] * 4
    for step in (2, 4):
        assert not (checkpoint_dir(two / "checkpoints", step) / LIVE_WEIGHTS).exists()  # in the shards
        m1, m2, l1, l2 = _model(one, step), _model(two, step), _live(one, step, cfg), _live(two, step, cfg)
        for name in l1:  # model/ is the average (every rank's shards of it), as one process's
            assert (m2[name] - l2[name]).abs().max() > 1e-4, name
            torch.testing.assert_close(m2[name], m1[name], rtol=0, atol=1e-6)
            torch.testing.assert_close(l2[name], l1[name], rtol=0, atol=1e-6)


def test_a_resumed_fsdp2_run_gathers_the_same_average(ema_runs):
    straight, halves, cfg = ema_runs["straight"], ema_runs["halves"], ema_runs["cfg"]
    volatile = (
        "time",
        "timing/",
        "cpu/",
        "perf/",
        "system/",
        "eval/",
        "channel/",
        "staleness/",
        "worker/",
        "idle/",
    )
    rows = [
        [{k: v for k, v in r.items() if not k.startswith(volatile)} for r in step_rows(d)]
        for d in (straight, halves)
    ]
    assert rows[0] == rows[1]
    for load in (_model, lambda d, s: _live(d, s, cfg)):
        a, b = load(straight, 4), load(halves, 4)
        assert all(torch.equal(a[name], b[name]) for name in a)


@pytest.fixture(scope="module")
def lora_runs(tiny_model_dir, tmp_path_factory):
    """LoRA adapters with a KL reference (the policy with its adapter off), 4 steps, evaluated at the start
    and the end: one process and two FSDP2 ranks (rank 0 publishes merged weights streamed from the
    shards, evaluates and checkpoints from transient plain LoRA copies)."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("fsdp2_lora")
    lora = {"model": {"lora": {"r": 4, "alpha": 8.0}}, "beta": 0.05, "lr_schedule": "constant"}

    def run(name, world_size, strategy):
        cfg = _cfg(tiny_model_dir, root / name, world_size, strategy, 4, **lora)
        cfg.monitor.eval_every = 4
        return train_decoupled(cfg, progress=False)

    return run("one", 1, "auto"), run("straight", 2, "fsdp2")


def test_two_fsdp2_ranks_train_a_lora_adapter_as_one_process(lora_runs):
    one, two = lora_runs
    r1, r2 = step_rows(one.run_dir), step_rows(two.run_dir)
    assert [r["reward/mean"] for r in r1] == [r["reward/mean"] for r in r2]  # workers got the same weights
    assert r1[-1]["actor/kl"] > 0
    for a, b in zip(r1, r2, strict=True):
        for key in ("actor/pg_loss", "actor/grad_norm", "actor/kl"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key  # pg_loss is ~0: fp32 noise
    assert two.last_metrics["eval/accuracy"] == one.last_metrics["eval/accuracy"]
    for step in (2, 4):  # model/ holds the adapter, gathered into a plain LoRA copy
        folders = [checkpoint_dir(r.run_dir / "checkpoints", step) / "model" for r in (one, two)]
        a, b = (safetensors.torch.load_file(f / "adapter_model.safetensors") for f in folders)
        assert a.keys() == b.keys() and all("lora_" in name for name in a)
        for name in a:
            torch.testing.assert_close(b[name], a[name], rtol=0, atol=1e-6)


@pytest.fixture(scope="module")
def critic_runs(tiny_model_dir, tmp_path_factory):
    """PPO with a separate value model, 4 steps: one process and two FSDP2 ranks (both the policy and the
    critic sharded in place on every rank); then one process resumes the two-rank run for a 5th step."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("fsdp2_critic")

    def run(name, world_size, strategy, steps=4, **kw):
        cfg = _cfg(tiny_model_dir, root / name, world_size, strategy, steps, critic={"lr": 1e-3})
        return train_decoupled(cfg, progress=False, **kw).run_dir

    one, two = run("one", 1, "auto"), run("straight", 2, "fsdp2")
    shutil.copytree(two, root / "to_one")
    (root / "to_one" / "summary.json").unlink()
    return one, two, run("to_one", 1, "auto", steps=5, resume=True)


def test_two_fsdp2_ranks_train_a_ppo_critic_as_one_process(critic_runs):
    one, two, _ = critic_runs
    r1, r2 = step_rows(one), step_rows(two)
    assert [r["reward/mean"] for r in r1] == [r["reward/mean"] for r in r2]
    for a, b in zip(r1, r2, strict=True):
        for key in ("actor/pg_loss", "actor/grad_norm", "critic/vf_loss", "critic/grad_norm"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key  # pg_loss is ~0: fp32 noise
    for step in (2, 4):
        w1, w2 = _model(one, step), _model(two, step)
        for name in w1:
            torch.testing.assert_close(w2[name], w1[name], rtol=0, atol=1e-6)
    ckpt = checkpoint_dir(two / "checkpoints", 4)
    assert (checkpoint_dir(one / "checkpoints", 4) / "critic").is_dir() and not (ckpt / "critic").exists()


def test_one_process_resumes_an_fsdp2_ppo_run(critic_runs, tiny_model_dir):
    """The critic and its AdamW state come back from the DCP shards, read whole (another world size): the
    one-process run's critic and moments, within fp32 summation order; and a one-process run resumes."""
    one, two, to_one = critic_runs
    rows = step_rows(to_one)
    assert [r["step"] for r in rows][-1] == 5 and rows[-1]["critic/grad_norm"] > 0
    cfg = _cfg(tiny_model_dir, two, 1, "auto", 4, critic={"lr": 1e-3})
    loaded = []
    for run_dir in (one, two):
        policy, _ = build_policy(cfg.model, seed=0)
        optimizer = build_optimizer(policy, cfg.trainer)
        critic, critic_optimizer = build_critic(cfg, seed=1)  # another head: what is loaded must replace it
        ckpt = checkpoint_dir(run_dir / "checkpoints", 4)
        load_checkpoint(
            ckpt, model=policy, optimizer=optimizer, critic=critic, critic_optimizer=critic_optimizer
        )
        loaded.append((critic.state_dict(), [s["exp_avg"] for s in critic_optimizer.state.values()]))
    (c1, m1), (c2, m2) = loaded
    assert c1.keys() == c2.keys() and len(m1) == len(m2) == len(c1)
    for name in c1:
        torch.testing.assert_close(c2[name], c1[name], rtol=0, atol=1e-6)
    for a, b in zip(m1, m2, strict=True):
        assert float(a.abs().max()) > 0
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-8)
