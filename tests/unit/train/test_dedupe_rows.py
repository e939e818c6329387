"""``trainer.dedupe_rows``: rows identical in prompt and response run through the model once, and the
log-probs, entropies, gradients and metrics are those of running every row."""

from __future__ import annotations

import math

import pytest
import torch
from grad_capture import capture_grads

from tandem.config.schema import AlgorithmConfig, TrainerConfig
from tandem.models import load_causal_lm, response_logprobs
from tandem.models.forward import distinct_rows
from tandem.train.optim import build_optimizer
from tandem.train.update import UpdateSettings, policy_update
from tandem.types import Experience, RolloutBatch


def _rows_with_copies(seed: int = 0):
    """3 groups of 4 samples (group 1 left padded); in each group some samples repeat an earlier one."""
    g = torch.Generator().manual_seed(seed)
    G, n, P, R = 3, 4, 6, 5
    prompt_ids = torch.randint(4, 40, (G, P), generator=g).repeat_interleave(n, 0)  # [12, P]
    prompt_mask = torch.ones(G * n, P, dtype=torch.bool)
    prompt_mask[4:8, :2] = False
    prompt_ids[4:8, :2] = 0
    lengths = torch.randint(1, R + 1, (G * n,), generator=g)
    response_mask = torch.arange(R)[None] < lengths[:, None]  # [12, R]
    response_ids = torch.randint(4, 40, (G * n, R), generator=g) * response_mask
    # copies: row 2 = row 0, row 3 = row 0, row 7 = row 5 (group 1), row 11 = row 9
    for dst, src in ((2, 0), (3, 0), (7, 5), (11, 9)):
        response_ids[dst], response_mask[dst] = response_ids[src], response_mask[src]
    return prompt_ids, prompt_mask, response_ids, response_mask


def test_distinct_rows_keeps_first_copies_in_row_order():
    batch = _rows_with_copies()
    keep, back = distinct_rows(*batch)
    assert keep.tolist() == [0, 1, 4, 5, 6, 8, 9, 10]
    assert back.tolist() == [0, 1, 0, 0, 2, 3, 4, 3, 5, 6, 7, 6]
    for t in batch:
        assert torch.equal(t[keep][back], t)


def test_distinct_rows_tells_rows_apart_by_every_tensor():
    p_ids, p_mask, r_ids, r_mask = _rows_with_copies()
    assert distinct_rows(p_ids[:2], p_mask[:2], r_ids[:2], r_mask[:2]) is None  # all distinct
    # the same response tokens with a shorter mask, or under another prompt, are other rows
    r_mask2 = r_mask.clone()
    r_mask2[2] = False
    r_mask2[2, 0] = True
    p_ids2 = p_ids.clone()
    p_ids2[3, -1] += 1
    keep, _ = distinct_rows(p_ids2, p_mask, r_ids, r_mask2)
    assert {2, 3} <= set(keep.tolist())
    assert distinct_rows(p_ids[:1], p_mask[:1], r_ids[:1], r_mask[:1]) is None


@pytest.mark.parametrize("share_prefix", [False, True])
@pytest.mark.parametrize("micro", [None, 5])
def test_dedupe_equals_every_row_values_and_gradients(tiny_model_dir, share_prefix, micro):
    model = load_causal_lm(tiny_model_dir)
    batch = _rows_with_copies()
    seen: list[int] = []
    model.register_forward_pre_hook(
        lambda _m, args, kw: seen.append(int(kw["input_ids"].shape[0])), with_kwargs=True
    )
    kw = {"with_entropy": True, "share_prefix": share_prefix, "micro_batch_size": micro}
    plain, ent_a = response_logprobs(model, *batch, **kw)
    rows_plain = sum(seen) if not share_prefix else None
    seen.clear()
    once, ent_b = response_logprobs(model, *batch, dedupe=True, **kw)
    if not share_prefix:
        assert rows_plain == 12 and sum(seen) == 8  # the 4 copies never reached the model
    torch.testing.assert_close(once, plain, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent_b, ent_a, atol=1e-5, rtol=1e-5)
    weights = torch.randn(plain.shape, generator=torch.Generator().manual_seed(1))  # copies weigh differently
    params = list(model.parameters())
    ga = torch.autograd.grad((plain * weights).sum(), params)
    gb = torch.autograd.grad((once * weights).sum(), params)
    for a, b in zip(ga, gb, strict=True):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-4)


def test_dedupe_with_packed_token_budget(tiny_model_dir):
    model = load_causal_lm(tiny_model_dir)
    batch = _rows_with_copies()
    plain, _ = response_logprobs(model, *batch, micro_batch_tokens=20)
    once, _ = response_logprobs(model, *batch, micro_batch_tokens=20, dedupe=True)
    torch.testing.assert_close(once, plain, atol=1e-5, rtol=1e-5)


def _experience() -> Experience:
    p_ids, p_mask, r_ids, r_mask = _rows_with_copies()
    B = p_ids.shape[0]
    g = torch.Generator().manual_seed(2)
    scores = torch.rand(B, generator=g)
    for dst, src in ((2, 0), (3, 0), (7, 5), (11, 9)):
        scores[dst] = scores[src]  # a copy has its original's score, hence its advantage
    rollout = RolloutBatch(
        prompt_ids=p_ids,
        prompt_mask=p_mask,
        response_ids=r_ids,
        response_mask=r_mask,
        behavior_logprobs=torch.zeros(B, r_ids.shape[1]),
        group_ids=torch.arange(B) // 4,
        policy_version=torch.zeros(B, dtype=torch.long),
        prompts=["p"] * B,
        completions=["c"] * B,
        finish_reasons=["stop"] * B,
    )
    adv = (scores - scores.view(3, 4).mean(1).repeat_interleave(4))[:, None].expand_as(r_ids) * r_mask
    return Experience(rollout=rollout, scores=scores, old_logprobs=None, advantages=adv, returns=adv)


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean"])
def test_update_with_dedupe_equals_every_row(tiny_model_dir, aggregation):
    """The whole update (GRPO loss, entropy bonus, the copies' metrics) with and without the dedupe."""
    exp = _experience()
    results = {}
    for dedupe in (False, True):
        model = load_causal_lm(tiny_model_dir)
        algo = AlgorithmConfig(name="grpo", aggregation=aggregation, entropy_coef=0.01)
        trainer = TrainerConfig(max_grad_norm=None, lr=1e-3, dedupe_rows=dedupe)
        settings = UpdateSettings.from_config(
            algo, trainer, temperature=1.0, autocast_bf16=False, max_new_tokens=5, share_prefix=True,
            dedupe=trainer.dedupe_rows,
        )  # fmt: skip
        opt = build_optimizer(model, trainer)
        grads = capture_grads(model, opt)
        metrics = policy_update(model, opt, None, exp, settings, generator=torch.Generator().manual_seed(0))
        results[dedupe] = (grads, metrics)
    (full, m_full), (once, m_once) = results[False], results[True]
    assert "actor/distinct_frac" not in m_full
    assert m_once["actor/distinct_frac"] == pytest.approx(8 / 12)
    for name in full:
        torch.testing.assert_close(once[name], full[name], rtol=1e-4, atol=1e-7)
    for key in ("actor/pg_loss", "actor/loss", "actor/entropy", "actor/grad_norm"):
        assert math.isclose(m_once[key], m_full[key], rel_tol=1e-4, abs_tol=1e-7), key
