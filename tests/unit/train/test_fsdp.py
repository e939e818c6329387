"""FSDP2 learner math: two gloo ranks with the policy sharded by ``fully_shard`` == one process.

The ranks run the real :class:`LearnerStep` with :class:`FullyShardedDataParallel` (built by the learner's
own :func:`sharded_rank`): rank 0 broadcasts the batch, each rank back-propagates its rows, FSDP2
reduce-scatters (sums) the gradients of each shard. The gradients each optimiser step sees, gathered into
full tensors, must equal the single-process gradients on the same batch. These are decoupled learners:
rank 0 shards its policy in place and keeps no plain copy (its original parameters are freed); after the
step it publishes the weights streamed from the shards into a shared-memory weight channel, which must
hold exactly the gathered shards and equal the single-process weights. Then a DCP checkpoint is written
by both ranks, read back into a freshly sharded model (same world size: bitwise), and read here by one
process.
"""

from __future__ import annotations

import dataclasses
import gc
import multiprocessing as mp
import weakref
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from tandem.channels.weights import SharedMemoryWeights
from tandem.config import build_config
from tandem.errors import ConfigError
from tandem.models import load_causal_lm
from tandem.models.lora import AdapterDisabled, apply_lora, publishable_state_dict
from tandem.monitor import PhaseTimer
from tandem.orchestration.decoupled.learner import ChannelWeights
from tandem.orchestration.dp_learner import (
    release_plain_optimizer,
    shard_reference,
    sharded_rank,
    whole_groups,
)
from tandem.orchestration.learner import LearnerStep
from tandem.train.distributed import DataParallel, host_store, init_group, join_store
from tandem.train.experience import ExperienceSettings, scoring_logprobs
from tandem.train.fsdp import (
    gather_optimizer_state,
    load_sharded,
    local_bytes,
    save_sharded,
    shard_module,
    stream_full,
    unsharded_copy,
)
from tandem.train.optim import build_optimizer
from tandem.types import RolloutBatch

B, P, R, N = 12, 5, 7, 3  # 4 groups of 3 samples
# fp32 summation order differs between one backward over all rows and a sum of two half backwards.
GRAD_RTOL = 1e-5  # max |g_fsdp - g_1| <= GRAD_RTOL * max |g_1|, per optimiser step
WEIGHT_ATOL = 1e-6  # after the optimiser steps (lr 1e-3)

CASES = {
    # token-mean, one optimiser step over micro-batches, no old/ref passes
    "token_mean": {"algorithm": {"name": "rloo", "beta": 0.0}, "trainer": {"micro_batch_size": 2}},
    # seq-mean, 2 epochs x 2 shuffled mini-batches: old and reference log-probs scored on the shards
    "seq_mean": {
        "algorithm": {"name": "grpo", "beta": 0.05},
        "trainer": {"mini_batch_size": 6, "micro_batch_size": 3, "ppo_epochs": 2},
    },
    # a loss that needs whole groups: each rank back-propagates 2 of the 4 groups
    "whole_groups": {"algorithm": {"name": "agro"}, "trainer": {"micro_batch_size": 3}},
    # groups of unequal size (adaptive group size grew one to 9): rank 0's 12 rows take 4 micro-batches,
    # rank 1's 6 take 2, so rank 1 runs 2 passes that add nothing (FSDP2's collectives need as many)
    "uneven_groups": {
        "algorithm": {"name": "agro"},
        "trainer": {"micro_batch_size": 3},
        "groups": [3, 9, 3, 3],
    },
    # identical rows run once in the update (dedupe_rows), also under FSDP2; the groups' scores differ, but
    # every row of a group is the same sequence: 4 distinct rows of 12
    "dedupe": {"algorithm": {"name": "rloo"}, "trainer": {"micro_batch_size": 6}, "copies": True},
    # packed token-budget micro-batches: each rank's count depends on its rows' lengths (fillers even it out)
    # (a budget of 19 tokens packs rank 0's rows into 3 micro-batches and rank 1's into 4)
    "packed": {"algorithm": {"name": "rloo", "beta": 0.0}, "trainer": {"micro_batch_tokens": 19}},
    # the same budget in the no-grad scoring passes (old log-probs: 2 epochs x 2 mini-batches): each rank's
    # share of the batch packs into its own number of forwards too (fillers again; this crashed before)
    "packed_scored": {
        "algorithm": {"name": "grpo", "beta": 0.05},
        "trainer": {"micro_batch_tokens": 19, "mini_batch_size": 6, "ppo_epochs": 2},
    },
    # bf16 compute and bf16 gradient reduce-scatters (FSDP2 MixedPrecisionPolicy): the master shards and
    # the AdamW moments stay fp32; the gradient is one process's fp32 one to bf16 precision
    "bf16": {
        "algorithm": {"name": "grpo", "beta": 0.0},
        "trainer": {"micro_batch_size": 3, "fsdp": {"param_dtype": "bfloat16", "reduce_dtype": "bfloat16"}},
        "grad_rtol": 3e-2,
    },
    # a group's rows share its prompt and the learner scores each prompt once (shared_prefix): a sharded
    # model runs the prompt and response passes on every micro-batch, shared or not, so both ranks run as
    # many forwards. Groups of 4, 2, 3, 3 in 2-row micro-batches: rank 0's three each hold one group, rank
    # 1's middle one holds two groups' rows (nothing to share: one pass, were it not for the rule)
    "prefix": {
        "algorithm": {"name": "grpo", "beta": 0.05},
        "trainer": {"micro_batch_size": 2, "shared_prefix": True},
        "groups": [4, 2, 3, 3],
        "shared_prompts": True,
    },
    # LoRA adapters (the base frozen, sharded too) and the KL reference that is the sharded policy with its
    # adapter off, scored on the shards; published merged under the base names
    "lora": {
        "algorithm": {"name": "grpo", "beta": 0.05},
        "trainer": {"mini_batch_size": 6, "micro_batch_size": 3, "ppo_epochs": 2},
        "model": {"lora": {"r": 4, "alpha": 8.0}},
    },
}


def _cfg(model_dir: Path, case: dict, strategy: str = "fsdp2", mode: str = "decoupled"):
    return build_config(
        {
            "model": {"path": str(model_dir)} | case.get("model", {}),
            "data": {"task": "arith", "prompts_per_step": B // N},
            "rollout": {"n": N, "max_new_tokens": R},
            "algorithm": case["algorithm"],
            "trainer": {"lr": 1e-3, "total_steps": 1, "shared_prefix": False, "strategy": strategy}
            | case["trainer"],
            "architecture": {"mode": mode, "learner": {"world_size": 2}},
            **({"critic": case["critic"]} if "critic" in case else {}),
        }
    )


def _batch(
    vocab: int, groups: list[int] | None = None, copies: bool = False, shared_prompts: bool = False
) -> tuple[RolloutBatch, torch.Tensor]:
    """``B`` rows in groups of ``N``, or groups of the ``groups`` sizes (as adaptive group size grows them).
    ``copies``: every group's rows are copies of its first (same prompt and response: one distinct row each).
    ``shared_prompts``: every group's rows have its first row's prompt (as sampled groups do)."""
    sizes = torch.tensor(groups or [N] * (B // N))
    rows = int(sizes.sum())
    g = torch.Generator().manual_seed(3)
    lengths = torch.randint(1, R + 1, (rows,), generator=g)
    mask = torch.arange(R)[None, :] < lengths[:, None]  # [B, R] ragged
    prompt_mask = torch.ones(rows, P, dtype=torch.bool)
    prompt_mask[::4, 0] = False  # some left padding
    batch = RolloutBatch(
        prompt_ids=torch.randint(3, vocab, (rows, P), generator=g) * prompt_mask,
        prompt_mask=prompt_mask,
        response_ids=torch.randint(3, vocab, (rows, R), generator=g) * mask,
        response_mask=mask,
        behavior_logprobs=-torch.rand(rows, R, generator=g) * 3 * mask,
        group_ids=torch.repeat_interleave(torch.arange(len(sizes)), sizes),
        policy_version=torch.zeros(rows, dtype=torch.long),
        prompts=["p"] * rows,
        completions=["c"] * rows,
        finish_reasons=["length"] * rows,
    )
    scores = torch.rand(rows, generator=g)
    first = torch.searchsorted(batch.group_ids, batch.group_ids)  # [rows] each group's first row
    if shared_prompts:
        batch = dataclasses.replace(
            batch, prompt_ids=batch.prompt_ids[first], prompt_mask=batch.prompt_mask[first]
        )
    if copies:
        batch = dataclasses.replace(
            batch,
            prompt_ids=batch.prompt_ids[first],
            prompt_mask=batch.prompt_mask[first],
            response_ids=batch.response_ids[first],
            response_mask=batch.response_mask[first],
            behavior_logprobs=batch.behavior_logprobs[first],
        )
    return batch, scores


def _record(optimizer: torch.optim.Optimizer, grads: list[torch.Tensor]) -> None:
    """Append the full gradient each ``optimizer.step()`` sees (DTensor shards gathered: collective)."""

    def hook(*_):
        params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        full = [p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad for p in params]
        grads.append(torch.cat([g.reshape(-1) for g in full]))

    optimizer.register_step_pre_hook(hook)


def _policy(cfg) -> tuple[torch.nn.Module, torch.nn.Module | None]:
    """The policy and its reference (β > 0); with LoRA, an adapter whose ``B`` is not zero (the policy
    differs from the reference from the start) and the policy with the adapter off as the reference."""
    policy = load_causal_lm(cfg.model.path)
    if not cfg.model.lora.enabled:
        return policy, load_causal_lm(cfg.model.path) if cfg.algorithm.beta > 0 else None
    torch.manual_seed(11)  # lora_A: the same draw in every process
    lo = cfg.model.lora
    policy = apply_lora(policy, r=lo.r, alpha=lo.alpha, dropout=0.0, target_modules=lo.target_modules)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.05)
    return policy, AdapterDisabled(policy)


def _learner(cfg, dp: DataParallel | None) -> tuple[LearnerStep, list[torch.Tensor]]:
    policy, ref = _policy(cfg)
    optimizer = build_optimizer(policy, cfg.trainer)
    learn = LearnerStep.from_config(
        cfg,
        policy=policy,
        ref_model=ref,
        optimizer=optimizer,
        scheduler=None,
        timer=PhaseTimer(),
        generator=torch.Generator().manual_seed(7),
    )
    grads: list[torch.Tensor] = []
    if dp is None:
        _record(optimizer, grads)
        return learn, grads
    originals = [weakref.ref(p) for p in policy.parameters()]
    fsdp = sharded_rank(cfg, dp, policy, {"optimizer": optimizer.state_dict()})
    fsdp.scheduler = None  # as the single-process reference: a constant learning rate
    shard_reference(cfg, fsdp, ref)  # a separate KL reference: sharded too (as DataParallelLearner.start)
    if dp.rank == 0:  # as DataParallelLearner.start: the plain optimiser lets go of the parameters
        release_plain_optimizer(learn.optimizer)
    else:
        learn.policy, learn.optimizer = fsdp.module, fsdp.optimizer
    del policy, optimizer
    gc.collect()
    learn.originals_alive = sum(r() is not None for r in originals)  # type: ignore[attr-defined]
    learn.dp = fsdp
    _record(fsdp.optimizer, grads)
    return learn, grads


def _run_case(cfg, dp: DataParallel | None, case: dict) -> dict:
    learn, grads = _learner(cfg, dp)
    if dp is None or dp.rank == 0:
        metrics = learn(
            *_batch(
                learn.policy.config.vocab_size,
                case.get("groups"),
                case.get("copies", False),
                case.get("shared_prompts", False),
            )
        )
    else:
        inputs = learn.dp.receive()
        assert inputs is not None
        learn.generator.set_state(inputs.generator_state)
        metrics = learn(inputs.batch, inputs.scores)
    out = {"grads": grads, "metrics": metrics}
    if dp is None:
        out["weights"] = _flat(publishable_state_dict(learn.policy), cfg.model.path)
        return out
    out["learn"] = learn
    out.update(_publish(cfg, learn))
    return out


def _flat(params: dict[str, torch.Tensor], model_dir) -> torch.Tensor:
    """The parameters in a plain model's ``parameters()`` order (tied ones once), flattened."""
    names = [n for n, _ in load_causal_lm(model_dir).named_parameters()]
    return torch.cat([params[n].detach().reshape(-1) for n in names])


def _publish(cfg, learn: LearnerStep) -> dict:
    """After the step: rank 0 publishes the streamed weights into a shared-memory weight channel as a
    decoupled run does (:class:`ChannelWeights`; rank 1 serves the gathers from its receive loop, then is
    stopped); both ranks then gather a plain copy of the policy (:func:`unsharded_copy`) whose publishable
    weights (a LoRA policy's: merged) must be exactly what was published. What rank 0 holds is counted too."""
    fsdp = learn.dp
    out: dict = {
        "originals_alive": learn.originals_alive,
        "all_sharded": all(isinstance(p, DTensor) for p in learn.policy.parameters()),
        "plain_in_optimizer": sum(len(g["params"]) for g in learn.optimizer.param_groups)
        if fsdp.rank == 0
        else 0,
        "bytes": local_bytes(learn.policy),
        "dtypes": sorted(
            {str(p.dtype) for p in learn.policy.parameters()}
            | {str(v.dtype) for st in learn.optimizer.state.values() for v in st.values() if v.dim()}
        ),
        "policy_bytes": sum(p.numel() * p.element_size() for p in _policy(cfg)[0].parameters()),
    }
    ref = learn.ref_model
    if ref is not None and not isinstance(ref, AdapterDisabled):  # a KL reference of its own
        out["reference_sharded"] = all(isinstance(p, DTensor) for p in ref.parameters())
        out["reference_bytes"] = local_bytes(ref)
    if fsdp.rank == 0:
        template = load_causal_lm(cfg.model.path).state_dict()
        out["full_bytes"] = sum(t.numel() * t.element_size() for t in template.values())
        sink = SharedMemoryWeights(template)
        try:
            nbytes = ChannelWeights(sink, learn).publish(learn.policy, 7)
            fetched = sink.fetch(-1)
        finally:
            sink.unlink()
        assert fetched is not None and fetched[1] == 7
        published = fetched[0]
        fsdp.send_stop()
        out["published_bytes"] = nbytes
        out["weights"] = _flat(published, cfg.model.path)
    else:
        assert learn.weights() is None and fsdp.receive() is None  # served the gather, then stopped
    gathered = publishable_state_dict(unsharded_copy(learn.policy, stream_full(learn.policy)))
    if fsdp.rank == 0:
        out["published_exact"] = published.keys() == gathered.keys() and all(
            torch.equal(published[n], gathered[n]) for n in gathered
        )
    return out


def _shard_fresh(model_dir: str, cfg) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    module = shard_module(load_causal_lm(model_dir))
    return module, build_optimizer(module, cfg.trainer)


def _scoring_checks(fsdp, cfg, vocab: int) -> dict:
    """The no-grad scoring passes on the shards against a plain copy of the same weights, each with the
    sizes of the ``scorer`` calls this rank made: copies run once (4 distinct rows of 12, 2 per rank),
    every row (6 per rank), and token-budget chunks whose count differs per rank (fillers even it out)."""
    plain = unsharded_copy(fsdp.module, stream_full(fsdp.module))
    base = ExperienceSettings.from_config(
        cfg.algorithm, temperature=1.0, autocast_bf16=False, micro_batch_size=2
    )
    calls: list[int] = []

    def spy(model, r, s):
        calls.append(r.batch_size)
        return scoring_logprobs(model, r, s)

    out = {}
    variants = {
        "dedupe": (True, dataclasses.replace(base, dedupe=True)),
        "every_row": (True, base),
        "tokens": (False, dataclasses.replace(base, micro_batch_tokens=19)),
    }
    for name, (copies, s) in variants.items():
        batch, _ = _batch(vocab, copies=copies)
        calls.clear()
        got = fsdp.scoring_logprobs(spy, fsdp.module, batch, s)
        expected = scoring_logprobs(plain, batch, dataclasses.replace(s, dedupe=False))
        out[name] = {"diff": float((got - expected).abs().max()), "calls": list(calls)}
    return out


def _colocated_lora(model_dir: str, rank: int) -> dict:
    """A colocated LoRA learner's sharding (:func:`replicates_frozen`): which parameters are sharded, and
    whether rank 0's sharded module shares the frozen base with its plain copy (the engine's weights)."""
    cfg = _cfg(Path(model_dir), CASES["lora"], mode="colocated")
    policy, _ = _policy(cfg)
    extra = {"optimizer": build_optimizer(policy, cfg.trainer).state_dict()}
    fsdp = sharded_rank(cfg, DataParallel(rank, 2, whole_groups=whole_groups(cfg)), policy, extra)
    params = dict(fsdp.module.named_parameters())
    out = {
        "frozen_plain": all(not isinstance(p, DTensor) for p in params.values() if not p.requires_grad),
        "trained_sharded": all(isinstance(p, DTensor) for p in params.values() if p.requires_grad),
        "n_frozen": sum(not p.requires_grad for p in params.values()),
    }
    if rank == 0:
        full = dict(fsdp.full.named_parameters())
        out["shares_base"] = all(full[n] is p for n, p in params.items() if not p.requires_grad)
        out["own_adapters"] = all(full[n] is not p for n, p in params.items() if p.requires_grad)
    return out


def _rank_main(rank: int, port: int, model_dir: str, out: str) -> None:
    torch.set_num_threads(1)
    init_group(join_store(port, 2, 60.0), rank, 2, "gloo")
    try:
        results = {}
        for name, case in CASES.items():
            cfg = _cfg(Path(model_dir), case)
            res = _run_case(cfg, DataParallel(rank, 2, whole_groups=whole_groups(cfg)), case)
            learn = res.pop("learn")
            results[name] = res
            if name == "seq_mean":
                fsdp, dcp_cfg = learn.dp, cfg
                results["scoring"] = _scoring_checks(fsdp, cfg, learn.policy.config.vocab_size)
        results["colocated_lora"] = _colocated_lora(model_dir, rank)
        # DCP: seq_mean's sharded policy and optimiser, written by both ranks, read back resharded.
        folder = Path(out) / "dcp"
        save_sharded(folder, fsdp.module, fsdp.optimizer)
        module, optimizer = _shard_fresh(model_dir, dcp_cfg)
        load_sharded(folder, module, optimizer)
        same_params = all(
            torch.equal(a.to_local(), b.to_local())
            for a, b in zip(fsdp.module.parameters(), module.parameters(), strict=True)
        )
        same_optim = all(
            all(torch.equal(_local(sa[k]), _local(sb[k])) for k in sa)
            for sa, sb in zip(fsdp.optimizer.state.values(), optimizer.state.values(), strict=True)
        ) and len(optimizer.state) == len(fsdp.optimizer.state)
        results["dcp"] = {
            "same_params": same_params,
            "same_optim": same_optim,
            "optim_full": gather_optimizer_state(fsdp.optimizer),
            "bytes": local_bytes(fsdp.module, fsdp.optimizer),
        }
        torch.save(results, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


@pytest.fixture(scope="module")
def fsdp_results(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp")
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
    return out, [torch.load(out / f"rank{r}.pt", weights_only=False) for r in (0, 1)]


@pytest.mark.parametrize("name", list(CASES))
def test_fsdp2_gradients_equal_one_process(name, fsdp_results, tiny_model_dir):
    torch.set_num_threads(1)
    _, (rank0, rank1) = fsdp_results
    ref = _run_case(_cfg(tiny_model_dir, CASES[name], strategy="auto"), None, CASES[name])
    r0, r1 = rank0[name], rank1[name]
    assert len(ref["grads"]) == len(r0["grads"]) == len(r1["grads"]) >= 1
    for g1, g0, gr in zip(ref["grads"], r0["grads"], r1["grads"], strict=True):
        assert g1.abs().max() > 0
        assert torch.equal(g0, gr)  # the gathered gradient is the same on both ranks
        diff = float((g0 - g1).abs().max())
        assert diff <= CASES[name].get("grad_rtol", GRAD_RTOL) * float(g1.abs().max()), (name, diff)
        if "grad_rtol" in CASES[name]:  # and it did compute in the lower precision
            assert diff > GRAD_RTOL * float(g1.abs().max()), (name, diff)
    assert r0["dtypes"] == r1["dtypes"] == ["torch.float32"]  # master shards and AdamW state
    if "grad_rtol" in CASES[name]:  # lower precision: Adam's normalised step amplifies tiny gradients'
        return  # differences, so the weights are not compared (the gradients above are)
    torch.testing.assert_close(r0["weights"], ref["weights"], rtol=0, atol=WEIGHT_ATOL)
    for key in ("actor/pg_loss", "actor/grad_norm", "rollout/logprob_diff_mean"):
        assert r0["metrics"][key] == pytest.approx(ref["metrics"][key], rel=1e-5, abs=1e-7), key
        assert r0["metrics"][key] == r1["metrics"][key], key
    if CASES[name].get("copies"):  # the update ran each distinct row once on the shards too
        assert r0["metrics"]["actor/distinct_frac"] == ref["metrics"]["actor/distinct_frac"] == 4 / 12


@pytest.mark.parametrize("name", list(CASES))
def test_decoupled_rank0_holds_only_its_shards(name, fsdp_results, tiny_model_dir):
    """A decoupled FSDP2 learner's rank 0 holds no unsharded policy parameters: the plain parameters it
    loaded are freed (no reference left), every policy parameter is a DTensor, its plain optimiser holds
    none, and its local parameter bytes are its shard (about half of the model on 2 ranks, as rank 1)."""
    _, (rank0, rank1) = fsdp_results
    for r in (rank0[name], rank1[name]):
        assert r["originals_alive"] == 0 and r["all_sharded"] and r["plain_in_optimizer"] == 0
    model_bytes = rank0[name]["policy_bytes"]  # a LoRA policy's: its base and its adapter
    assert rank0[name]["bytes"] + rank1[name]["bytes"] == model_bytes
    assert rank0[name]["bytes"] <= 0.6 * model_bytes


@pytest.mark.parametrize(
    "name", [n for n, c in CASES.items() if c["algorithm"].get("beta") and "model" not in c]
)
def test_a_separate_reference_is_sharded_too(name, fsdp_results):
    """β > 0 with a reference model of its own: every rank holds its shard of it, not a whole copy (the
    reference passes on the shards are checked against one process by the gradients above)."""
    _, (rank0, rank1) = fsdp_results
    assert rank0[name]["reference_sharded"] and rank1[name]["reference_sharded"]
    whole = rank0[name]["policy_bytes"]  # the same architecture
    assert rank0[name]["reference_bytes"] + rank1[name]["reference_bytes"] == whole
    assert rank0[name]["reference_bytes"] <= 0.6 * whole


@pytest.mark.parametrize("name", list(CASES))
def test_published_weights_are_the_gathered_shards(name, fsdp_results):
    """Rank 0's streamed publish put exactly the gathered shards into the weight channel, every entry
    (the single-process comparison of the same weights: test_fsdp2_gradients_equal_one_process)."""
    _, (rank0, _) = fsdp_results
    assert rank0[name]["published_exact"]
    assert rank0[name]["published_bytes"] == rank0[name]["full_bytes"]


def test_sharded_scoring_shares_distinct_rows_and_runs_as_many_forwards(fsdp_results):
    """Scoring on the shards gives the plain copy's log-probs. With dedupe the batch's 4 distinct rows are
    shared out (2 and 2) instead of each rank scoring its 6; with a token budget the ranks' shares pack into
    different numbers of forwards and the shorter one runs one-row fillers, so both make as many calls."""
    _, (rank0, rank1) = fsdp_results
    for name in ("dedupe", "every_row", "tokens"):
        a, b = rank0["scoring"][name], rank1["scoring"][name]
        assert a["diff"] <= 1e-5 and b["diff"] <= 1e-5, name
        assert len(a["calls"]) == len(b["calls"]), name  # every forward is a collective
    assert rank0["scoring"]["dedupe"]["calls"] == rank1["scoring"]["dedupe"]["calls"] == [2]
    assert rank0["scoring"]["every_row"]["calls"] == [2, 2, 2]
    tokens = rank0["scoring"]["tokens"]["calls"], rank1["scoring"]["tokens"]["calls"]
    assert tokens[0] != tokens[1] and 1 in tokens[0] + tokens[1]  # unequal packing, a filler ran
    assert sum(tokens[0]) + sum(tokens[1]) > 12  # the fillers' rows on top of the batch's 12


def test_colocated_lora_keeps_the_base_once_on_rank_0(fsdp_results):
    """Colocated with LoRA, the frozen base stays whole on every rank (not sharded) and rank 0's sharded
    module uses its plain copy's base tensors: rank 0 holds the base once, not the base and its shards.
    Only the adapters are sharded; rank 0's plain copy has its own whole adapters (the engine's)."""
    _, (rank0, rank1) = fsdp_results
    for r in (rank0["colocated_lora"], rank1["colocated_lora"]):
        assert r["n_frozen"] > 0 and r["frozen_plain"] and r["trained_sharded"]
    assert rank0["colocated_lora"]["shares_base"] and rank0["colocated_lora"]["own_adapters"]


def test_dcp_checkpoint_restores_same_and_one_process(fsdp_results, tiny_model_dir):
    out, (rank0, rank1) = fsdp_results
    for r in (rank0, rank1):  # same world size: every local shard bitwise equal
        assert r["dcp"]["same_params"] and r["dcp"]["same_optim"]
    # another world size (1, no process group): the whole tensors
    cfg = _cfg(tiny_model_dir, CASES["seq_mean"])
    model = load_causal_lm(tiny_model_dir)
    optimizer = build_optimizer(model, cfg.trainer)
    load_sharded(out / "dcp", model, optimizer)
    weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    assert torch.equal(weights, rank0["seq_mean"]["weights"])
    full = rank0["dcp"]["optim_full"]["state"]
    assert len(optimizer.state) == len(full)
    params = [p for g in optimizer.param_groups for p in g["params"]]  # the state dict's index order
    for i, p in enumerate(params):
        for k in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(optimizer.state[p][k], full[i][k]), (i, k)


def test_fsdp2_config_rules(tiny_model_dir):
    shared = _cfg(tiny_model_dir, {"algorithm": {"name": "rloo"}, "trainer": {"shared_prefix": True}})
    assert shared.trainer.prefix_sharing  # fsdp2 keeps prefix sharing (two passes per micro-batch)
    # shares that need unequal numbers of passes are run with passes that add nothing: token budgets too
    assert _cfg(tiny_model_dir, {"algorithm": {"name": "agro"}, "trainer": {"micro_batch_tokens": 32}})
    critic = {"lr": 1e-3}  # a separate value model is sharded like the policy; a shared head is refused
    assert _cfg(tiny_model_dir, {"algorithm": {"name": "ppo"}, "trainer": {}, "critic": critic}).critic
    with pytest.raises(ConfigError, match="trainer.strategy"):
        _cfg(
            tiny_model_dir,
            {"algorithm": {"name": "ppo"}, "trainer": {}, "critic": critic | {"shared_backbone": True}},
        )
    with pytest.raises(ConfigError, match="trainer.strategy"):  # one process, two ranks
        _cfg(tiny_model_dir, {"algorithm": {"name": "rloo"}, "trainer": {}}, strategy="single")
    assert _cfg(tiny_model_dir, CASES["token_mean"], strategy="ddp").trainer.strategy == "ddp"
    with pytest.raises(ConfigError, match="trainer.strategy"):  # fsdp2 with one rank
        build_config(
            {
                "model": {"path": str(tiny_model_dir)},
                "data": {"task": "arith"},
                "trainer": {"strategy": "fsdp2"},
            }
        )
