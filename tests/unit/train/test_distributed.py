"""Data-parallel learner math: two gloo ranks (spawned processes on 127.0.0.1) == one process.

The ranks run the real :class:`LearnerStep` (rank 0 broadcasts the batch, log-prob and old-value passes
are sharded, policy and critic gradients are all-reduced before clipping); the reference runs the same
step in this process. Batches have ragged response lengths, so per-rank normalisers would give different
gradients: the comparison fails unless the GLOBAL token/sequence counts are used. PPO cases record the
critic's gradients (value loss) too: a separate value model with its own optimiser, a shared-backbone
head trained in the policy's backward, and that head's warm-up (only the head learns).
"""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tandem.algos import ADVANTAGE_ESTIMATORS
from tandem.config import build_config
from tandem.errors import ConfigError, TandemError
from tandem.models import load_causal_lm
from tandem.monitor import PhaseTimer
from tandem.orchestration.build import build_critic
from tandem.orchestration.dp_learner import whole_groups
from tandem.orchestration.learner import LearnerStep
from tandem.train.distributed import (
    DataParallel,
    fingerprint,
    host_store,
    init_group,
    join_store,
    resolve_backend,
)
from tandem.train.optim import build_optimizer
from tandem.train.update import group_shuffle
from tandem.types import Experience, RolloutBatch

B, P, R, N = 12, 5, 7, 3  # 4 groups of 3 samples
# fp32 summation order differs between one backward over all rows and a sum of two half backwards.
GRAD_RTOL = 1e-5  # max |g_dp - g_1| <= GRAD_RTOL * max |g_1|, per optimiser step
WEIGHT_ATOL = 1e-6  # after the optimiser steps (lr 1e-3)

CASES = {
    # token-mean, one optimiser step over micro-batches, no old/ref passes
    "token_mean": {"algorithm": {"name": "rloo", "beta": 0.0}, "trainer": {"micro_batch_size": 2}},
    # seq-mean, 2 epochs x 2 shuffled mini-batches, old and reference log-probs sharded over the ranks
    "seq_mean": {
        "algorithm": {"name": "grpo", "beta": 0.05},
        "trainer": {"mini_batch_size": 6, "micro_batch_size": 3, "ppo_epochs": 2},
    },
    # a loss that needs whole groups: ranks split by groups
    "whole_groups": {"algorithm": {"name": "agro"}, "trainer": {"micro_batch_size": 3}},
    # PPO, separate critic: GAE on sharded old values, critic update over 2 shuffled mini-batches
    "ppo_critic": {
        "algorithm": {"name": "ppo", "beta": 0.05},
        "trainer": {"mini_batch_size": 6, "micro_batch_size": 2},
        "critic": {"lr": 1e-3},
    },
    # PPO, shared-backbone head: its gradients join the policy's reduction
    "ppo_shared": {
        "algorithm": {"name": "ppo", "beta": 0.0},
        "trainer": {"micro_batch_size": 4},
        "critic": {"lr": 1e-3, "shared_backbone": True},
    },
    # the shared head's warm-up: critic_update with the policy optimiser, only the head learns
    "ppo_shared_warmup": {
        "algorithm": {"name": "ppo", "beta": 0.0},
        "trainer": {"micro_batch_size": 4},
        "critic": {"lr": 1e-3, "shared_backbone": True, "warmup_steps": 1},
    },
}


def _cfg(model_dir: Path, case: dict):
    return build_config(
        {
            "model": {"path": str(model_dir)},
            "data": {"task": "arith", "prompts_per_step": B // N},
            "rollout": {"n": N, "max_new_tokens": R},
            "algorithm": case["algorithm"],
            "trainer": {"lr": 1e-3, "total_steps": 1, **case["trainer"]},
            "architecture": {"mode": "decoupled", "learner": {"world_size": 2}},
            **({"critic": case["critic"]} if "critic" in case else {}),
        }
    )


def _batch(vocab: int) -> tuple[RolloutBatch, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    lengths = torch.randint(1, R + 1, (B,), generator=g)
    mask = torch.arange(R)[None, :] < lengths[:, None]  # [B, R] ragged
    prompt_mask = torch.ones(B, P, dtype=torch.bool)
    prompt_mask[::4, 0] = False  # some left padding
    batch = RolloutBatch(
        prompt_ids=torch.randint(3, vocab, (B, P), generator=g) * prompt_mask,
        prompt_mask=prompt_mask,
        response_ids=torch.randint(3, vocab, (B, R), generator=g) * mask,
        response_mask=mask,
        behavior_logprobs=-torch.rand(B, R, generator=g) * 3 * mask,
        group_ids=torch.arange(B) // N,
        policy_version=torch.zeros(B, dtype=torch.long),
        prompts=["p"] * B,
        completions=["c"] * B,
        finish_reasons=["length"] * B,
    )
    return batch, torch.rand(B, generator=g)


def _record(optimizer: torch.optim.Optimizer, grads: list[torch.Tensor]) -> None:
    """Append the (reduced) gradient each ``optimizer.step()`` sees: every parameter that has one."""

    def hook(*_):
        params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        grads.append(torch.cat([p.grad.reshape(-1) for p in params]))

    optimizer.register_step_pre_hook(hook)


def _count_head_rows(critic: torch.nn.Module, rows: dict[str, int]) -> None:
    """Count the rows the value head sees with and without autograd (back-propagated vs old values), so
    the test can tell each rank did its share rather than the whole batch."""

    def hook(_module, args, _out):
        rows["grad" if torch.is_grad_enabled() else "no_grad"] += int(args[0].shape[0])

    critic.head.register_forward_hook(hook)


def _learner(cfg) -> tuple[LearnerStep, dict[str, list[torch.Tensor]], dict[str, int]]:
    policy = load_causal_lm(cfg.model.path)
    ref = load_causal_lm(cfg.model.path) if cfg.algorithm.beta > 0 else None
    optimizer = build_optimizer(policy, cfg.trainer)
    critic, critic_optimizer = build_critic(cfg, seed=1, policy=policy, optimizer=optimizer)
    rows = {"grad": 0, "no_grad": 0}
    if critic is not None:
        _count_head_rows(critic, rows)
    grads: dict[str, list[torch.Tensor]] = {"policy": [], "critic": []}
    _record(optimizer, grads["policy"])  # with a shared head: policy and head gradients
    if critic_optimizer is not None:
        _record(critic_optimizer, grads["critic"])
    learn = LearnerStep.from_config(
        cfg,
        policy=policy,
        ref_model=ref,
        optimizer=optimizer,
        scheduler=None,
        timer=PhaseTimer(),
        generator=torch.Generator().manual_seed(7),
        critic=critic,
        critic_optimizer=critic_optimizer,
    )
    return learn, grads, rows


def _run_case(cfg, dp: DataParallel | None) -> dict:
    learn, grads, rows = _learner(cfg)
    learn.dp = dp
    if dp is None or dp.rank == 0:
        batch, scores = _batch(learn.policy.config.vocab_size)
        if not ADVANTAGE_ESTIMATORS.get(cfg.algorithm.advantage).uses_token_rewards:
            # per-turn rewards travel to the other ranks (ignored by this estimator: the numbers stay)
            batch.turn_rewards = torch.arange(B * R, dtype=torch.float32).view(B, R) * batch.response_mask
        metrics = learn(batch, scores)
    else:
        inputs = dp.receive()
        assert inputs is not None
        learn.generator.set_state(inputs.generator_state)
        metrics = learn(inputs.batch, inputs.scores)
        batch = inputs.batch
    models = [learn.policy] + ([] if learn.critic is None else [learn.critic])
    weights = torch.cat([p.detach().reshape(-1) for m in models for p in m.parameters()])
    return {
        "grads": grads,
        "weights": weights,
        "metrics": metrics,
        "head_rows": rows,
        "turns": batch.turn_rewards,
    }


def _rank_main(rank: int, port: int, model_dir: str, out: str) -> None:
    torch.set_num_threads(1)
    init_group(join_store(port, 2, 60.0), rank, 2, "gloo")
    try:
        results = {}
        for name, case in CASES.items():
            cfg = _cfg(Path(model_dir), case)
            results[name] = _run_case(cfg, DataParallel(rank, 2, whole_groups=whole_groups(cfg)))
        torch.save(results, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def dp_results(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("dp")
    store = host_store(2, 60.0)
    ctx = mp.get_context("spawn")
    procs = [
        ctx.Process(target=_rank_main, args=(r, store.port, str(tiny_model_dir), str(out))) for r in (0, 1)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        if p.is_alive():
            p.kill()
    assert [p.exitcode for p in procs] == [0, 0]
    return [torch.load(out / f"rank{r}.pt") for r in (0, 1)]


@pytest.mark.parametrize("name", list(CASES))
def test_two_ranks_equal_one_process(name, dp_results, tiny_model_dir):
    torch.set_num_threads(1)
    ref = _run_case(_cfg(tiny_model_dir, CASES[name]), None)
    rank0, rank1 = dp_results[0][name], dp_results[1][name]
    case = CASES[name]
    # Optimiser steps: the policy's (with a shared head: policy + head, or the head alone in warm-up) and
    # the separate critic's (none without one).
    for which in ("policy", "critic"):
        n = len(ref["grads"][which])
        assert n == len(rank0["grads"][which]) == len(rank1["grads"][which])
        assert (n >= 1) == (which == "policy" or name == "ppo_critic"), (which, n)
        for g1, g0, gr in zip(ref["grads"][which], rank0["grads"][which], rank1["grads"][which], strict=True):
            assert g1.abs().max() > 0
            assert torch.equal(g0, gr)  # every rank clips and steps with the same reduced gradient
            diff = float((g0 - g1).abs().max())
            assert diff <= GRAD_RTOL * float(g1.abs().max()), (name, which, diff)
    if "critic" in case:  # each rank valued and back-propagated its share of the rows, not all of them
        for kind in ("grad", "no_grad"):
            n0, n1, n = rank0["head_rows"][kind], rank1["head_rows"][kind], ref["head_rows"][kind]
            assert n0 + n1 == n and 0 < n0 < n, (kind, n0, n1, n)
    assert torch.equal(rank0["weights"], rank1["weights"])  # replicas identical
    if ref["turns"] is not None:  # rank 1 received the batch's per-turn rewards
        assert torch.equal(rank1["turns"], ref["turns"])
    torch.testing.assert_close(rank0["weights"], ref["weights"], rtol=0, atol=WEIGHT_ATOL)
    start = torch.cat([p.detach().reshape(-1) for p in load_causal_lm(tiny_model_dir).parameters()])
    policy_moved = not torch.equal(start, ref["weights"][: start.numel()])
    assert policy_moved == ("warmup_steps" not in case.get("critic", {}))  # warm-up: only the head learns
    keys = ("actor/pg_loss", "actor/grad_norm") if "warmup_steps" not in case.get("critic", {}) else ()
    if "critic" in case:
        keys += ("critic/vf_loss", "critic/values_mean")
    if name != "ppo_shared":  # the shared head's gradient norm is the policy's (actor/grad_norm)
        keys += ("critic/grad_norm",) if "critic" in case else ()
    if "warmup_steps" not in case.get("critic", {}):  # token means summed, maxima maxed over the ranks
        keys += ("rollout/logprob_diff_mean", "rollout/logprob_diff_max", "rollout/ratio_outside_frac")
        keys += ("actor/ratio_max",)
    # PPO's whitened advantages make pg_loss a sum that cancels to ~0 at ratio 1: absolute slack 1e-6.
    atol = 1e-6 if "critic" in case else 1e-7
    for key in keys:
        assert rank0["metrics"][key] == pytest.approx(ref["metrics"][key], rel=1e-5, abs=atol), key
        assert rank0["metrics"][key] == rank1["metrics"][key], key


def _exp(group_ids: torch.Tensor) -> Experience:
    n = len(group_ids)
    zeros = torch.zeros(n, 2)
    rollout = RolloutBatch(
        prompt_ids=zeros.long(),
        prompt_mask=zeros.bool(),
        response_ids=zeros.long(),
        response_mask=torch.ones(n, 2, dtype=torch.bool),
        behavior_logprobs=zeros,
        group_ids=group_ids,
        policy_version=torch.zeros(n, dtype=torch.long),
        prompts=[],
        completions=[],
        finish_reasons=[],
    )
    return Experience(
        rollout=rollout, scores=torch.zeros(n), old_logprobs=None, advantages=zeros, returns=zeros
    )


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("whole", [True, False])
def test_local_rows_partition_the_mini_batch(world, whole):
    gids = torch.arange(15) // 3
    order = group_shuffle(gids, torch.Generator().manual_seed(0))  # a shuffled mini-batch
    mb = _exp(gids[order])
    parts = [DataParallel(r, world, whole_groups=whole).local_rows(mb) for r in range(world)]
    assert sorted(torch.cat(parts).tolist()) == list(range(15))  # disjoint and complete
    assert max(len(p) for p in parts) - min(len(p) for p in parts) <= (3 if whole else 1)
    if whole:
        groups = [set(mb.rollout.group_ids[p].tolist()) for p in parts]
        assert all(not (a & b) for i, a in enumerate(groups) for b in groups[i + 1 :])  # no group split


def test_too_few_groups_for_the_ranks_is_a_clear_error():
    with pytest.raises(TandemError, match="architecture.learner.world_size"):
        DataParallel(2, 3, whole_groups=True).local_rows(_exp(torch.tensor([0, 0, 1, 1])))


def test_backend_resolution():
    assert resolve_backend("auto", torch.device("cpu")) == "gloo"
    assert resolve_backend("auto", torch.device("cuda", 0)) == "nccl"
    with pytest.raises(ConfigError, match="architecture.learner.dist_backend"):
        resolve_backend("nccl", torch.device("cpu"))


def test_fingerprint_sees_one_changed_bit(tiny_model_dir):
    a, b = load_causal_lm(tiny_model_dir), load_causal_lm(tiny_model_dir)
    assert fingerprint(a) == fingerprint(b)
    with torch.no_grad():
        w = next(b.parameters())
        w.view(-1)[5] = torch.nextafter(w.view(-1)[5], torch.tensor(1.0))
    assert fingerprint(a) != fingerprint(b)
