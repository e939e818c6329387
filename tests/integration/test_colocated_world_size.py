"""Colocated runs with several learner ranks (``trainer.world_size: 2``, gloo on CPU): rank 0 generates,
scores, logs and checkpoints as a one-process run does; rank 1 joins each step's learner phases.

* a 2-rank FSDP2 run's first update equals a one-process run's (loss and gradient norm within 1e-5
  relative, the weights after two steps within 1e-6: fp32 summation order is all that differs);
* a 4-step run on 2 ranks resumed from its step-2 checkpoint (as after a crash; inside the LR warm-up)
  logs the same metrics and ends with bitwise the same weights (the checkpoint holds the optimiser state
  as the ranks' DCP shards);
* one process resumes that step-2 checkpoint (another world size, the DCP shards read whole):
  close to the 2-rank run, not bitwise (gradient sums in another order);
* with a weight average (``trainer.ema_decay``; rank 0 averages its whole copy) a 2-rank run (FSDP2 or DDP) saves the
  one-process run's average as ``model/`` and its live weights beside it, and a resume from a checkpoint
  whose live weights are also in the DCP shards restarts the average from ``model/``, bitwise;
* impossible combinations are one-line ConfigErrors before anything is written.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import safetensors.torch
import torch
from run_checks import check_average_restored, step_rows

from tandem.config import build_config
from tandem.errors import ConfigError
from tandem.monitor.alerts import read_alerts
from tandem.orchestration.alerting import AlertStopError
from tandem.orchestration.colocated import train_colocated
from tandem.train.checkpoint import LIVE_WEIGHTS, checkpoint_dir

DIGITS = f"{Path(__file__).parents[1] / 'e2e' / 'digits_reward.py'}:digit_share"
# Wall clock and host metrics differ between any two runs; a leg's last step also evaluates.
VOLATILE = ("time", "timing/", "cpu/", "perf/", "system/", "eval/")


def _cfg(model_dir, out, world_size, total_steps, **overrides):
    cfg = {
        "run": {"output_dir": str(out), "seed": 5},
        "model": {"path": str(model_dir)},
        "data": {"task": "arith", "prompts_per_step": 2, "eval_size": 2, "train_size": 16},
        "rollout": {"n": 4, "max_new_tokens": 4},
        "algorithm": {"name": "grpo"},
        "reward": {"task_reward": False, "functions": [{"path": DIGITS}]},
        "trainer": {
            "total_steps": total_steps,
            "lr": 3e-3,
            "lr_schedule": "constant",  # the same schedule whatever total_steps a leg of a resumed run has
            "warmup_steps": 4,  # a resume inside the warm-up must take its next step at the warm-up's lr
            "world_size": world_size,
            "strategy": "fsdp2" if world_size > 1 else "single",
            "micro_batch_size": 2,
        },
        "checkpoint": {"every": 2, "keep_last": 9},
        "monitor": {"eval_every": 0, "sample_every": 0, "tensorboard": False, "progress": False},
    }
    for key, value in overrides.items():
        cfg[key] = {**cfg.get(key, {}), **value}
    return build_config(cfg)


def _weights(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    return safetensors.torch.load_file(
        checkpoint_dir(run_dir / "checkpoints", step) / "model" / "model.safetensors"
    )


def _stable(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith(VOLATILE)}


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("colocated_ws")
    one = train_colocated(_cfg(tiny_model_dir, root / "one", 1, 2))
    straight = train_colocated(_cfg(tiny_model_dir, root / "straight", 2, 4))
    for name in ("halves", "to_one"):  # the run as if it had died right after its step-2 checkpoint
        shutil.copytree(root / "straight", root / name)
        shutil.rmtree(checkpoint_dir(root / name / "checkpoints", 4))
        (root / name / "summary.json").unlink()
    halves = train_colocated(_cfg(tiny_model_dir, root / "halves", 2, 4), resume=True)
    to_one = train_colocated(_cfg(tiny_model_dir, root / "to_one", 1, 4), resume=True)
    assert not torch.distributed.is_initialized()
    return {"one": one, "straight": straight, "halves": halves, "to_one": to_one}


@pytest.fixture(scope="module")
def ema_runs(tiny_model_dir, tmp_path_factory):
    """One process, two FSDP2 ranks and two DDP ranks with a weight average, 4 steps; the FSDP2 run resumed
    from step 2."""
    torch.set_num_threads(1)
    root, ema = tmp_path_factory.mktemp("colocated_ema"), {"ema_decay": 0.5}
    one = train_colocated(_cfg(tiny_model_dir, root / "one", 1, 4, trainer=ema))
    straight = train_colocated(_cfg(tiny_model_dir, root / "straight", 2, 4, trainer=ema))
    ddp = train_colocated(_cfg(tiny_model_dir, root / "ddp", 2, 4, trainer={**ema, "strategy": "ddp"}))
    shutil.copytree(root / "straight", root / "halves")
    shutil.rmtree(checkpoint_dir(root / "halves" / "checkpoints", 4))
    (root / "halves" / "summary.json").unlink()
    halves = train_colocated(_cfg(tiny_model_dir, root / "halves", 2, 4, trainer=ema), resume=True)
    return {"one": one.run_dir, "straight": straight.run_dir, "halves": halves.run_dir, "ddp": ddp.run_dir}


def _one_two_resumed(model_dir, root: Path, **overrides) -> dict[str, Path]:
    """4 steps with ``overrides``: one process, two FSDP2 ranks, and the two-rank run resumed on two ranks
    from its step-2 checkpoint (as if it had died right after it)."""
    torch.set_num_threads(1)
    one = train_colocated(_cfg(model_dir, root / "one", 1, 4, **overrides))
    straight = train_colocated(_cfg(model_dir, root / "straight", 2, 4, **overrides))
    shutil.copytree(root / "straight", root / "halves")
    shutil.rmtree(checkpoint_dir(root / "halves" / "checkpoints", 4))
    (root / "halves" / "summary.json").unlink()
    halves = train_colocated(_cfg(model_dir, root / "halves", 2, 4, **overrides), resume=True)
    return {"one": one.run_dir, "straight": straight.run_dir, "halves": halves.run_dir}


@pytest.fixture(scope="module")
def lora_runs(tiny_model_dir, tmp_path_factory):
    """LoRA adapters with a KL reference (the policy with its adapter off)."""
    lora = {"model": {"lora": {"r": 4, "alpha": 8.0}}, "algorithm": {"beta": 0.05}}
    return _one_two_resumed(tiny_model_dir, tmp_path_factory.mktemp("colocated_lora"), **lora)


@pytest.fixture(scope="module")
def kl_runs(tiny_model_dir, tmp_path_factory):
    """A KL penalty to a reference model of its own (on two ranks sharded like the policy)."""
    kl = {"algorithm": {"beta": 0.5}}
    return _one_two_resumed(tiny_model_dir, tmp_path_factory.mktemp("colocated_kl"), **kl)


@pytest.fixture(scope="module")
def critic_runs(tiny_model_dir, tmp_path_factory):
    """PPO with a separate value model (on two ranks sharded like the policy)."""
    ppo = {"algorithm": {"name": "ppo"}, "critic": {"lr": 1e-3}}
    return _one_two_resumed(tiny_model_dir, tmp_path_factory.mktemp("colocated_critic"), **ppo)


@pytest.fixture(scope="module")
def adaptive_runs(tiny_model_dir, tmp_path_factory):
    """Adaptive group size (groups of unequal size, so the ranks' shares need unequal numbers of passes)."""
    # groups of 3 grown by 3: odd batches, so the ranks' shares (5 and 4 rows) take 3 and 2 micro-batches
    grow = {"algorithm": {"adaptive_group": {"enabled": True, "max_n": 9}}, "rollout": {"n": 3}}
    return _one_two_resumed(tiny_model_dir, tmp_path_factory.mktemp("colocated_adaptive"), **grow)


def _adapter(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    return safetensors.torch.load_file(
        checkpoint_dir(run_dir / "checkpoints", step) / "model" / "adapter_model.safetensors"
    )


def _live(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    return safetensors.torch.load_file(checkpoint_dir(run_dir / "checkpoints", step) / LIVE_WEIGHTS)


@pytest.mark.slow  # the module fixture trains four runs, two of them with a spawned rank
def test_two_fsdp2_ranks_update_as_one_process(runs):
    one, two = step_rows(runs["one"].run_dir), step_rows(runs["straight"].run_dir)
    assert one[0]["reward/mean"] == two[0]["reward/mean"]  # rank 0 sampled the same batch
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/entropy"):
        assert two[0][key] == pytest.approx(one[0][key], rel=1e-5, abs=1e-7), key
    assert one[0]["actor/grad_norm"] > 0
    w1, w2 = _weights(runs["one"].run_dir, 2), _weights(runs["straight"].run_dir, 2)
    assert w1.keys() == w2.keys()
    for name in w1:
        torch.testing.assert_close(w2[name], w1[name], rtol=0, atol=1e-6)


@pytest.mark.slow
def test_resume_on_the_same_world_size_is_exact(runs):
    """The checkpoint holds the optimiser state as DCP shards (one file per rank), no gathered copy."""
    ckpt = checkpoint_dir(runs["halves"].run_dir / "checkpoints", 2)
    assert len(list((ckpt / "sharded").glob("*.distcp"))) == 2 and not (ckpt / "optimizer.pt").exists()
    straight, halves = step_rows(runs["straight"].run_dir), step_rows(runs["halves"].run_dir)
    assert [r["step"] for r in halves] == [1, 2, 3, 4]
    assert [_stable(r) for r in halves] == [_stable(r) for r in straight]
    ws, wh = _weights(runs["straight"].run_dir, 4), _weights(runs["halves"].run_dir, 4)
    assert all(torch.equal(ws[name], wh[name]) for name in ws)


@pytest.mark.slow
def test_one_process_resumes_a_two_rank_run(runs):
    """2 -> 1: the same samples and state, gradients summed in another order: close, not bitwise."""
    straight, to_one = step_rows(runs["straight"].run_dir), step_rows(runs["to_one"].run_dir)
    assert [r["step"] for r in to_one] == [1, 2, 3, 4]
    for a, b in zip(straight[2:], to_one[2:], strict=True):
        assert b["reward/mean"] == a["reward/mean"]
        assert b["actor/grad_norm"] == pytest.approx(a["actor/grad_norm"], rel=1e-4)
    ws, w1 = _weights(runs["straight"].run_dir, 4), _weights(runs["to_one"].run_dir, 4)
    for name in ws:
        torch.testing.assert_close(w1[name], ws[name], rtol=0, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["straight", "ddp"], ids=["fsdp2", "ddp"])
def test_two_ranks_keep_the_one_process_weight_average(ema_runs, strategy):
    """Rank 0 averages its whole policy (FSDP2: its plain copy; DDP: its replica) after each step."""
    one, two = ema_runs["one"], ema_runs[strategy]
    rows = step_rows(two)
    assert [r["actor/ema_decay"] for r in rows] == [0.5] * 4  # min(0.5, n / (n + 1)) from update 1 on
    for step in (2, 4):
        w1, w2 = _weights(one, step), _weights(two, step)
        l1, l2 = _live(one, step), _live(two, step)
        assert l2.keys() == l1.keys() and set(l2) <= set(w2) and w2.keys() == w1.keys()
        for name in l2:  # model/ is the average, not the live weights, and equal to one process's
            assert (w2[name] - l2[name]).abs().max() > 1e-4, name
            torch.testing.assert_close(w2[name], w1[name], rtol=0, atol=1e-6)
            torch.testing.assert_close(l2[name], l1[name], rtol=0, atol=1e-6)


@pytest.mark.slow
def test_a_resumed_fsdp2_run_restarts_its_average_from_model(ema_runs):
    straight, halves = ema_runs["straight"], ema_runs["halves"]
    assert [_stable(r) for r in step_rows(halves)] == [_stable(r) for r in step_rows(straight)]
    for load in (_weights, _live):
        a, b = load(straight, 4), load(halves, 4)
        assert all(torch.equal(a[name], b[name]) for name in a)


@pytest.mark.slow
def test_two_fsdp2_ranks_train_a_lora_adapter_as_one_process(lora_runs):
    """The adapter (its base frozen and sharded too) and the KL against the base (the sharded policy with
    its adapter off) as in one process; the checkpoint's shards hold the adapter and its AdamW state only
    (the base is model.path's)."""
    one, two = step_rows(lora_runs["one"]), step_rows(lora_runs["straight"])
    assert one[0]["reward/mean"] == two[0]["reward/mean"]
    assert one[-1]["actor/kl"] > 0  # the adapter moved the policy away from the reference
    for a, b in zip(one, two, strict=True):
        for key in ("actor/pg_loss", "actor/grad_norm", "actor/kl"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key  # pg_loss is ~0: fp32 noise
    for step in (2, 4):
        w1, w2 = _adapter(lora_runs["one"], step), _adapter(lora_runs["straight"], step)
        assert w1.keys() == w2.keys() and all("lora_" in name for name in w1)
        for name in w1:
            torch.testing.assert_close(w2[name], w1[name], rtol=0, atol=1e-6)
    shards = checkpoint_dir(lora_runs["straight"] / "checkpoints", 2) / "sharded"
    stored = torch.distributed.checkpoint.FileSystemReader(str(shards)).read_metadata().state_dict_metadata
    kept = [k for k in stored if k.startswith("model.")]  # PEFT's names carry the adapter's: ".default"
    assert len(kept) == len(_adapter(lora_runs["one"], 2)) and all(".lora_" in k for k in kept)


@pytest.mark.slow
def test_two_fsdp2_ranks_train_a_ppo_critic_as_one_process(critic_runs):
    """The value model sharded like the policy: the same value loss and gradient norms as one process, the
    same policy weights; the checkpoint keeps the critic and its AdamW state in the DCP shards."""
    one, two = step_rows(critic_runs["one"]), step_rows(critic_runs["straight"])
    assert one[0]["reward/mean"] == two[0]["reward/mean"]
    for a, b in zip(one, two, strict=True):
        for key in ("actor/pg_loss", "actor/grad_norm", "critic/vf_loss", "critic/grad_norm"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key  # pg_loss is ~0: fp32 noise
    assert one[-1]["critic/grad_norm"] > 0
    w1, w2 = _weights(critic_runs["one"], 4), _weights(critic_runs["straight"], 4)
    for name in w1:
        torch.testing.assert_close(w2[name], w1[name], rtol=0, atol=1e-6)
    ckpt = checkpoint_dir(critic_runs["straight"] / "checkpoints", 2)
    assert not (ckpt / "critic").exists()
    stored = torch.distributed.checkpoint.FileSystemReader(str(ckpt / "sharded")).read_metadata()
    keys = stored.state_dict_metadata
    assert any(k.startswith("critic.head.") for k in keys) and any(
        k.startswith("critic_optim.") for k in keys
    )


@pytest.mark.slow
def test_two_fsdp2_ranks_score_a_sharded_reference_as_one_process(kl_runs):
    """The KL reference sharded like the policy (each rank holds half of it): the same KL, losses and
    weights as one process over 4 steps, and a resume on two ranks repeats them exactly."""
    one, two = step_rows(kl_runs["one"]), step_rows(kl_runs["straight"])
    assert one[0]["reward/mean"] == two[0]["reward/mean"]
    assert one[-1]["actor/kl_ref"] > 0  # the policy has moved from the reference
    for a, b in zip(one, two, strict=True):
        for key in ("actor/kl_ref", "actor/loss", "actor/grad_norm"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-7), key
    w1, w2 = _weights(kl_runs["one"], 4), _weights(kl_runs["straight"], 4)
    for name in w1:
        torch.testing.assert_close(w2[name], w1[name], rtol=0, atol=1e-6)
    halves = step_rows(kl_runs["halves"])
    assert [_stable(r) for r in halves] == [_stable(r) for r in two]


@pytest.mark.slow
def test_two_fsdp2_ranks_train_grown_groups_as_one_process(adaptive_runs):
    """Groups grown to unequal sizes split into unequal shares; the rank with fewer micro-batches runs
    passes that add nothing, and the update is one process's."""
    one, two = step_rows(adaptive_runs["one"]), step_rows(adaptive_runs["straight"])
    assert sum(r["adaptive/extra_samples"] for r in one) > 0  # some group grew: unequal shares
    for a, b in zip(one, two, strict=True):
        assert b["adaptive/extra_samples"] == a["adaptive/extra_samples"]
        for key in ("actor/pg_loss", "actor/grad_norm"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key  # pg_loss is ~0: fp32 noise
    w1, w2 = _weights(adaptive_runs["one"], 4), _weights(adaptive_runs["straight"], 4)
    for name in w1:
        torch.testing.assert_close(w2[name], w1[name], rtol=0, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("runs", "load"),
    [("lora_runs", _adapter), ("critic_runs", _weights), ("adaptive_runs", _weights)],
    ids=["lora", "ppo", "adaptive_group"],
)
def test_a_resumed_fsdp2_run_is_exact(request, runs, load):
    """LoRA (the adapter and its moments in the shards) and PPO (the critic and its moments too)."""
    straight, halves = (request.getfixturevalue(runs)[k] for k in ("straight", "halves"))
    assert [_stable(r) for r in step_rows(halves)] == [_stable(r) for r in step_rows(straight)]
    a, b = load(straight, 4), load(halves, 4)
    assert all(torch.equal(a[name], b[name]) for name in a)


@pytest.mark.parametrize(
    ("overrides", "key", "match"),
    [
        ({"trainer": {"world_size": 9, "strategy": "ddp"}}, "trainer.world_size", "exceeds the 8 samples"),
        (
            {"trainer": {"world_size": 2}, "architecture": {"learner": {"world_size": 3}}},
            "trainer.world_size",
            "same setting",
        ),
        ({"trainer": {"world_size": 2, "strategy": "single"}}, "trainer.strategy", "one learner process"),
        ({"trainer": {"world_size": 1, "strategy": "fsdp2"}}, "trainer.strategy", "needs trainer.world_size"),
        (
            {"critic": {"lr": 1e-3, "shared_backbone": True}, "algorithm": {"name": "ppo"}},
            "trainer.strategy",
            "critic.shared_backbone",
        ),
    ],
)
def test_impossible_combinations_are_one_line_config_errors(tiny_model_dir, tmp_path, overrides, key, match):
    with pytest.raises(ConfigError, match=key) as err:
        _cfg(tiny_model_dir, tmp_path, 2, 1, **overrides)
    assert match in str(err.value) and "\n" not in str(err.value)


def test_world_size_keys_are_one_setting(tiny_model_dir, tmp_path):
    cfg = _cfg(
        tiny_model_dir,
        tmp_path,
        1,
        1,
        trainer={"strategy": "ddp"},
        architecture={"learner": {"world_size": 2}},
    )
    assert cfg.trainer.world_size == cfg.architecture.learner.world_size == 2
    assert "world_size" not in cfg.model_dump()["architecture"]["learner"]  # saved configs: trainer's key
    assert build_config(cfg.model_dump()).architecture.learner.world_size == 2


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_rollback_with_fsdp2_restores_the_weight_average(lora, tiny_model_dir, tmp_path):
    """FSDP2 on two ranks with a weight average: colocated, rank 0 averages its plain copy alone. A
    rollback at step 5 (``lr_scale: 1``) restores step 3's checkpoint: the ranks their shards of the live
    weights, rank 0 the average from ``model/`` (check_average_restored), and the replayed steps take the
    same decay as the first ones (the average's update count comes back too). With LoRA the shards and
    the average hold the adapter only, and the replayed steps still repeat bit for bit."""
    rule = {"metric": "actor/lr", "kind": "above", "threshold": 2e-3, "action": "rollback", "lr_scale": 1.0}
    cfg = _cfg(
        tiny_model_dir,
        tmp_path / "run",
        2,
        6,
        trainer={"warmup_steps": 8, "ema_decay": 0.9},
        checkpoint={"every": 1},
        monitor={"alerts": [rule], "max_rollbacks": 1},
        **({"model": {"lora": {"r": 4, "alpha": 8.0}}} if lora else {}),
    )
    with pytest.raises(AlertStopError):
        train_colocated(cfg)
    rows = step_rows(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 4, 5]
    assert [r["actor/ema_decay"] for r in rows[3:5]] == [r["actor/ema_decay"] for r in rows[5:7]]
    assert [r["actor/grad_norm"] for r in rows[3:5]] == [r["actor/grad_norm"] for r in rows[5:7]]
    assert check_average_restored(tmp_path / "run", cfg) == 4


def test_rollback_with_two_ddp_ranks_restores_every_rank(tiny_model_dir, tmp_path):
    """An alert's rollback on a 2-rank DDP learner: rank 0 restores the checkpoint and hands its state to
    rank 1 (weights, AdamW moments, schedule), so the ranks stay replicas (each step checks it and would
    fail otherwise) and the run equals the same run on one process: same alert, same learning rates, the
    same weights up to fp32 summation order. The rule fires exactly once by construction: the LR warms up
    past its threshold at step 2 and stays below it at half the rate."""
    rule = {"metric": "actor/lr", "kind": "above", "threshold": 2e-3, "action": "rollback", "lr_scale": 0.5}

    def run(name, world_size):
        cfg = _cfg(
            tiny_model_dir,
            tmp_path / name,
            world_size,
            6,
            trainer={"strategy": "ddp" if world_size > 1 else "single"},
            checkpoint={"every": 1},
            monitor={"alerts": [rule]},
        )
        train_colocated(cfg)
        return tmp_path / name

    one, two = run("one", 1), run("two", 2)
    lrs = {d: [(r["step"], r["actor/lr"]) for r in step_rows(d)] for d in (one, two)}
    assert lrs[one] == lrs[two]
    steps = [s for s, _ in lrs[two]]
    assert steps.count(1) == 2 and max(steps) == 6, steps  # rolled back once, to step 0's checkpoint
    alerts = read_alerts(two)
    assert [a["action"] for a in alerts] == ["rollback"] and alerts[0]["step"] == 2
    final = {
        d: safetensors.torch.load_file(
            str(checkpoint_dir(d / "checkpoints", 6) / "model" / "model.safetensors")
        )
        for d in (one, two)
    }
    for k, v in final[one].items():
        torch.testing.assert_close(final[two][k], v, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_a_rollback_on_two_ranks_replays_the_same_steps(strategy, tiny_model_dir, tmp_path):
    """The restore is exact on every rank. A rollback with ``lr_scale: 1`` at step 5 restores step 2's
    checkpoint (weights, AdamW moments, schedule, RNG), so the replayed steps 3-5 are the first ones bit for
    bit: step 3's gradient norm checks the weights, step 4's the moments step 3's update used, step 5's
    the schedule every rank stepped to after it. (The rule then fires again at step 5 and, with no rollback
    left, stops the run.) DDP: rank 0 restores and hands its state to rank 1; FSDP2: each rank reads its
    own shards, takes rank 0's schedule, and rank 0's plain copy (the rollout engine's weights) takes the
    restored weights. The KL reference is reset to the policy every 2 steps (``algorithm.kl.ref_sync_steps``):
    rank 0 restores step 2's reference from the checkpoint and hands it to rank 1, whose own copy had moved
    on at step 4, so the replayed step 3 measures the first one's KL."""
    # warm-up 3e-3 * (k + 1) / 8: step 5 is the first above the threshold; checkpoints at steps 2 and 4
    rule = {"metric": "actor/lr", "kind": "above", "threshold": 2e-3, "action": "rollback", "lr_scale": 1.0}
    cfg = _cfg(
        tiny_model_dir,
        tmp_path / "run",
        2,
        6,
        algorithm={"beta": 0.5, "kl": {"ref_sync_steps": 2, "ref_sync_alpha": 1.0}},
        trainer={"strategy": strategy, "warmup_steps": 8},
        checkpoint={"every": 2},
        monitor={"alerts": [rule], "max_rollbacks": 1},
    )
    with pytest.raises(AlertStopError):
        train_colocated(cfg)
    rows = step_rows(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 3, 4, 5]
    for first, again in zip(rows[2:5], rows[5:8], strict=True):
        for key in ("reward/mean", "actor/grad_norm", "actor/lr", "actor/pg_loss", "actor/kl_ref"):
            assert first[key] == again[key], (first["step"], key)
