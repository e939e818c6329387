"""Packing and token-budget micro-batches: packed rows score like padded rows, every packing gives the
full-batch gradient, and gradient checkpointing changes memory, not gradients."""

from __future__ import annotations

import math

import pytest
import torch
from grad_capture import capture_grads
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from tandem.config import load_config
from tandem.config.schema import AlgorithmConfig, TrainerConfig
from tandem.errors import ConfigError, ModelError
from tandem.models import load_causal_lm, response_logprobs
from tandem.models.packing import pack_rows, row_lengths, token_budget_chunks
from tandem.train.optim import build_optimizer
from tandem.train.update import UpdateSettings, micro_batches, policy_update
from tandem.types import Experience, RolloutBatch


def _rows(B=8, P=6, R=12, seed=0):
    """Left-padded prompts of 1..P tokens, right-padded responses of 0..R tokens (one row empty)."""
    g = torch.Generator().manual_seed(seed)
    p_len = torch.randint(1, P + 1, (B,), generator=g)
    r_len = torch.randint(1, R + 1, (B,), generator=g)
    r_len[1] = 0
    prompt_mask = torch.arange(P)[None, :] >= (P - p_len)[:, None]
    response_mask = torch.arange(R)[None, :] < r_len[:, None]
    prompt_ids = torch.randint(4, 40, (B, P), generator=g) * prompt_mask
    response_ids = torch.randint(4, 40, (B, R), generator=g) * response_mask
    return prompt_ids, prompt_mask, response_ids, response_mask


def _experience(B=8, seed=0) -> Experience:
    prompt_ids, prompt_mask, response_ids, mask = _rows(B=B, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    R = mask.shape[1]
    rollout = RolloutBatch(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        response_ids=response_ids,
        response_mask=mask,
        behavior_logprobs=-torch.rand(B, R, generator=g) * mask,
        group_ids=torch.arange(B) // 4,
        policy_version=torch.zeros(B, dtype=torch.long),
        prompts=["p"] * B,
        completions=["c"] * B,
        finish_reasons=["stop"] * B,
    )
    adv = torch.randn(B, 1, generator=g).expand(B, R) * mask
    return Experience(
        rollout=rollout, scores=torch.randn(B, generator=g), old_logprobs=None, advantages=adv, returns=adv
    )


# -- planning ----------------------------------------------------------------------------------------------


def test_token_budget_chunks_partition_the_rows_within_the_budget():
    lengths = torch.tensor([5, 30, 7, 12, 3, 20, 9, 1])
    chunks = token_budget_chunks(lengths, 32)
    assert sorted(torch.cat(chunks).tolist()) == list(range(8))
    assert all(int(lengths[c].sum()) <= 32 for c in chunks)
    assert len(chunks) == math.ceil(int(lengths.sum()) / 32)  # first-fit decreasing is tight here


def test_token_budget_chunks_keep_groups_whole_and_run_a_long_row_alone():
    lengths = torch.tensor([4, 4, 4, 4, 50, 2, 2, 2])
    groups = torch.tensor([0, 0, 1, 1, 2, 3, 3, 3])
    chunks = token_budget_chunks(lengths, 10, groups)
    for c in chunks:
        for g in groups[c].unique():
            assert set(c.tolist()) >= set(torch.nonzero(groups == g).flatten().tolist())
    assert [4] in [c.tolist() for c in chunks]  # 50 tokens > budget: alone
    with pytest.raises(ModelError):
        token_budget_chunks(lengths, 0)


def test_pack_rows_lays_sequences_end_to_end():
    rows = _rows()
    layout = pack_rows(*rows)
    lengths = row_lengths(rows[1], rows[3])
    real = int(lengths[rows[3].any(dim=1)].sum())
    assert layout.real_tokens == real and layout.input_ids.shape[1] == int(lengths.max())
    assert layout.input_ids.shape[0] < 7  # several sequences share a bin
    assert int(layout.position_ids.eq(0).sum()) - layout.padding == 7  # one start per non-empty row
    assert layout.tokens.numel() == int(rows[3].sum())


# -- packed forward ----------------------------------------------------------------------------------------


def _tiny(arch: str, attn: str):
    torch.manual_seed(0)
    kw = dict(
        vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    config = LlamaConfig(**kw) if arch == "llama" else Qwen2Config(**kw)
    config._attn_implementation = attn
    return (LlamaForCausalLM if arch == "llama" else Qwen2ForCausalLM)(config)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_logprobs_and_gradients_equal_the_padded_ones(arch, attn):
    """Position ids restarting at 0 with no 2D mask give block-diagonal attention in transformers: a
    leak across sequences would change these values far beyond 1e-5."""
    rows = _rows()
    grads = []
    outs = []
    for kw in ({}, {"packed": True}, {"micro_batch_tokens": 24}):
        model = _tiny(arch, attn)
        lp, ent = response_logprobs(model, *rows, with_entropy=True, temperature=0.7, **kw)
        (lp.sum() + ent.sum()).backward()
        outs.append((lp.detach(), ent.detach()))
        grads.append({n: p.grad for n, p in model.named_parameters()})
    for (lp, ent), g in zip(outs[1:], grads[1:], strict=True):
        torch.testing.assert_close(lp, outs[0][0], rtol=0, atol=1e-5)
        torch.testing.assert_close(ent, outs[0][1], rtol=0, atol=1e-5)
        assert (lp[~rows[3]] == 0).all()
        for name, grad in g.items():
            torch.testing.assert_close(grad, grads[0][name], rtol=1e-4, atol=1e-6)


# -- the update --------------------------------------------------------------------------------------------


def _grads_after_one_step(model_dir, exp, aggregation, **trainer_kw):
    model = load_causal_lm(model_dir)
    trainer = TrainerConfig(max_grad_norm=None, lr=1e-3, **trainer_kw)
    settings = UpdateSettings.from_config(
        AlgorithmConfig(name="grpo", aggregation=aggregation),
        trainer,
        temperature=1.0,
        autocast_bf16=False,
        max_new_tokens=12,
        share_prefix=True,
    )
    opt = build_optimizer(model, trainer)
    grads = capture_grads(model, opt)
    return grads, policy_update(model, opt, None, exp, settings), model


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_any_token_budget_gives_the_full_batch_gradient(tiny_model_dir, aggregation):
    exp = _experience()
    full, m_full, _ = _grads_after_one_step(tiny_model_dir, exp, aggregation)
    for budget in (12, 40, 1000):  # many micro-batches (rows alone), a few, one
        packed, m_packed, _ = _grads_after_one_step(
            tiny_model_dir, exp, aggregation, micro_batch_tokens=budget
        )
        for name in full:
            torch.testing.assert_close(packed[name], full[name], rtol=1e-4, atol=1e-6)
        for key in ("actor/pg_loss", "actor/loss", "actor/entropy"):
            assert math.isclose(m_full[key], m_packed[key], rel_tol=1e-4, abs_tol=1e-6), key


def test_micro_batches_follow_the_budget_and_keep_groups_for_agro():
    exp = _experience()
    r = exp.rollout
    lengths = row_lengths(r.prompt_mask, r.response_mask)
    rows = torch.arange(exp.batch_size)
    trainer = TrainerConfig(micro_batch_tokens=20)
    for name, whole in (("grpo", False), ("agro", True)):
        algo = (
            AlgorithmConfig(name=name) if name == "grpo" else AlgorithmConfig(name="grpo", policy_loss="agro")
        )
        s = UpdateSettings.from_config(algo, trainer, temperature=1.0, autocast_bf16=False, max_new_tokens=12)
        assert s.whole_groups is whole and s.share_prefix is False
        chunks = micro_batches(exp, rows, 8, s)
        assert sorted(torch.cat(chunks).tolist()) == list(range(8))
        if whole:
            assert all(len(set(r.group_ids[c].tolist())) * 4 == len(c) for c in chunks)
        else:
            assert all(int(lengths[c].sum()) <= 20 or len(c) == 1 for c in chunks)


def test_gradient_checkpointing_gives_the_same_gradients(tiny_model_dir):
    exp = _experience()
    plain, _, _ = _grads_after_one_step(tiny_model_dir, exp, "token-mean")
    ckpt, _, model = _grads_after_one_step(tiny_model_dir, exp, "token-mean", gradient_checkpointing=True)
    assert model.is_gradient_checkpointing
    for name in plain:
        torch.testing.assert_close(ckpt[name], plain[name], rtol=1e-5, atol=1e-7)


def test_micro_batch_tokens_excludes_micro_batch_size(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text(
        "model: {path: models/tiny}\ndata: {task: arith, prompts_per_step: 4}\nrollout: {n: 4}\n"
        "algorithm: {name: grpo}\n"
    )
    assert load_config(path, ["trainer.micro_batch_tokens=512"]).trainer.micro_batch_tokens == 512
    with pytest.raises(ConfigError, match="trainer.micro_batch_tokens"):
        load_config(path, ["trainer.micro_batch_tokens=512", "trainer.micro_batch_size=4"])


def test_scoring_passes_follow_the_token_budget(tiny_model_dir):
    """Old/ref log-prob scoring with ``micro_batch_tokens`` runs packed chunks and gives the same values."""
    from tandem.train.experience import ExperienceSettings, scoring_logprobs

    model = load_causal_lm(tiny_model_dir)
    r = _experience().rollout
    algo = AlgorithmConfig(name="grpo")
    plain = ExperienceSettings.from_config(algo, temperature=1.0, autocast_bf16=False, micro_batch_size=None)
    budget = ExperienceSettings.from_config(
        algo, temperature=1.0, autocast_bf16=False, micro_batch_size=None, micro_batch_tokens=16
    )
    torch.testing.assert_close(
        scoring_logprobs(model, r, budget), scoring_logprobs(model, r, plain), atol=1e-5, rtol=0
    )
