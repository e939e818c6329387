"""response_logprobs equals a per-row unpadded forward, whatever the padding, micro-batching or LM-head path."""

from __future__ import annotations

import pytest
import torch

from tandem.errors import ModelError
from tandem.models import load_causal_lm, positions_from_mask, response_logprobs


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return load_causal_lm(tiny_model_dir)


def _padded_batch(seed: int = 0):
    """Prompts of different lengths (left padded) and responses of different lengths (right padded)."""
    gen = torch.Generator().manual_seed(seed)
    prompt_lens, response_lens = [5, 2, 7], [4, 6, 1]
    P, R = max(prompt_lens), max(response_lens)
    prompt_ids = torch.zeros((3, P), dtype=torch.long)
    prompt_mask = torch.zeros((3, P), dtype=torch.bool)
    response_ids = torch.zeros((3, R), dtype=torch.long)
    response_mask = torch.zeros((3, R), dtype=torch.bool)
    for i, (p, r) in enumerate(zip(prompt_lens, response_lens, strict=True)):
        prompt_ids[i, P - p :] = torch.randint(4, 100, (p,), generator=gen)
        prompt_mask[i, P - p :] = True
        response_ids[i, :r] = torch.randint(4, 100, (r,), generator=gen)
        response_mask[i, :r] = True
    return prompt_ids, prompt_mask, response_ids, response_mask


def _naive(model, prompt_ids, prompt_mask, response_ids, response_mask, temperature):
    """Row by row, without any padding: full logits, log_softmax, gather; entropy of each position."""
    lps = torch.zeros(response_ids.shape)
    ents = torch.zeros(response_ids.shape)
    for i in range(prompt_ids.shape[0]):
        p = prompt_ids[i][prompt_mask[i]]
        r = response_ids[i][response_mask[i]]
        logits = model(torch.cat([p, r])[None]).logits[0, len(p) - 1 : len(p) + len(r) - 1] / temperature
        logp = torch.log_softmax(logits, dim=-1)
        lps[i, : len(r)] = logp.gather(-1, r[:, None]).squeeze(-1)
        ents[i, : len(r)] = -(logp.exp() * logp).sum(-1)
    return lps, ents


def test_positions_ignore_left_padding():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    assert positions_from_mask(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_matches_unpadded_forward(model, temperature):
    batch = _padded_batch()
    with torch.no_grad():
        lp, ent = response_logprobs(model, *batch, temperature=temperature, with_entropy=True)
        ref_lp, ref_ent = _naive(model, *batch, temperature)
    assert lp.dtype == torch.float32 and lp.shape == batch[2].shape
    torch.testing.assert_close(lp, ref_lp, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent, ref_ent, atol=1e-5, rtol=0)
    assert (lp[~batch[3]] == 0).all() and (ent[~batch[3]] == 0).all()


def test_micro_batched_equals_full_batch(model):
    batch = _padded_batch(seed=1)
    with torch.no_grad():
        full, _ = response_logprobs(model, *batch)
        micro, ent = response_logprobs(model, *batch, micro_batch_size=2)
    torch.testing.assert_close(micro, full, atol=1e-6, rtol=0)
    assert ent is None


class _NoLogitsToKeep(torch.nn.Module):
    """A causal LM wrapper whose forward has no ``logits_to_keep`` (forces the full-logits path)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=False):
        return self.inner(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=use_cache
        )


def test_full_logits_fallback_matches(model):
    batch = _padded_batch(seed=2)
    with torch.no_grad():
        fast, _ = response_logprobs(model, *batch)
        slow, _ = response_logprobs(_NoLogitsToKeep(model), *batch)
    torch.testing.assert_close(slow, fast, atol=1e-6, rtol=0)


def test_gradients_flow(model):
    batch = _padded_batch(seed=3)
    model.zero_grad()
    lp, _ = response_logprobs(model, *batch)
    lp.sum().backward()
    grad = model.model.layers[0].self_attn.q_proj.weight.grad
    assert grad is not None and grad.abs().sum() > 0
    model.zero_grad()


def test_temperature_must_be_positive(model):
    with pytest.raises(ModelError, match="temperature"):
        response_logprobs(model, *_padded_batch(), temperature=0.0)


def _grouped_batch(G=3, n=4, P=6, R=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    prompt_ids = torch.randint(3, 20, (G, P), generator=g).repeat_interleave(n, 0)  # [G*n, P]
    prompt_mask = torch.ones(G, P, dtype=torch.bool)
    prompt_mask[1, :2] = False  # one group is left padded
    prompt_mask = prompt_mask.repeat_interleave(n, 0)
    response_ids = torch.randint(3, 20, (G * n, R), generator=g)
    response_mask = torch.arange(R)[None] < torch.randint(1, R + 1, (G * n, 1), generator=g)
    return prompt_ids, prompt_mask, response_ids, response_mask


@pytest.mark.parametrize("micro", [None, 4])
def test_shared_prefix_equals_plain_path_values_and_gradients(tiny_model_dir, micro):
    """One prompt pass per group (KV cache repeated over the group) gives the plain path's log-probs,
    entropies and parameter gradients (fp32 summation order only)."""
    model = load_causal_lm(tiny_model_dir)
    batch = _grouped_batch()
    plain, ent_a = response_logprobs(model, *batch, with_entropy=True, micro_batch_size=micro)
    shared, ent_b = response_logprobs(
        model, *batch, with_entropy=True, micro_batch_size=micro, share_prefix=True
    )
    torch.testing.assert_close(shared, plain, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent_b, ent_a, atol=1e-5, rtol=1e-5)
    params = list(model.parameters())
    ga = torch.autograd.grad(plain.sum(), params)
    gb = torch.autograd.grad(shared.sum(), params)
    for a, b in zip(ga, gb, strict=True):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-4)


def test_shared_prefix_falls_back_when_no_rows_share_a_prompt(tiny_model_dir, monkeypatch):
    """Rows whose neighbours all have other prompts (e.g. an interleaved mini-batch) take the plain path —
    there is nothing to share."""
    from tandem.models import forward

    model = load_causal_lm(tiny_model_dir)
    p_ids, p_mask, r_ids, r_mask = _grouped_batch()
    order = torch.arange(12).view(3, 4).t().reshape(-1)  # g0, g1, g2, g0, ...: no neighbour shares
    batch = (p_ids[order], p_mask[order], r_ids[order], r_mask[order])
    assert forward.prompt_runs(batch[0], batch[1]) is None

    def boom(*a, **k):
        raise AssertionError("shared-prefix path taken")

    monkeypatch.setattr(forward, "_shared_prefix_logprobs", boom)
    plain, _ = response_logprobs(model, *batch)
    torch.testing.assert_close(response_logprobs(model, *batch, share_prefix=True)[0], plain)


@pytest.mark.parametrize("micro", [None, 6])
def test_shared_prefix_with_ragged_runs_equals_plain_path(tiny_model_dir, monkeypatch, micro):
    """Runs of 4, 1, 2 and 3 rows (grown groups, a group's greedy row; a micro-batch of 6 splits the run of
    2): one prompt pass per run of each chunk gives the plain path's log-probs, entropies and gradients."""
    from tandem.models import forward

    model = load_causal_lm(tiny_model_dir)
    p_ids, p_mask, r_ids, r_mask = _grouped_batch()  # 3 groups of 4
    rows = torch.tensor([0, 1, 2, 3, 4, 8, 9, 5, 6, 7])  # runs g0 x4, g1 x1, g2 x2, g1 x3
    batch = (p_ids[rows], p_mask[rows], r_ids[rows], r_mask[rows])
    assert forward.prompt_runs(batch[0], batch[1]).tolist() == [0, 0, 0, 0, 1, 2, 2, 3, 3, 3]
    passes: list[int] = []  # prompt passes per shared-prefix call
    real = forward._shared_prefix_logprobs

    def counted(*a, **k):
        passes.append(int(k["runs"].max()) + 1)
        return real(*a, **k)

    monkeypatch.setattr(forward, "_shared_prefix_logprobs", counted)
    kw = {"with_entropy": True, "micro_batch_size": micro}
    shared, ent_b = response_logprobs(model, *batch, share_prefix=True, **kw)
    assert passes == ([4] if micro is None else [3, 2])
    plain, ent_a = response_logprobs(model, *batch, with_entropy=True, micro_batch_size=micro)
    torch.testing.assert_close(shared, plain, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent_b, ent_a, atol=1e-5, rtol=1e-5)
    params = list(model.parameters())
    for a, b in zip(
        torch.autograd.grad(plain.sum(), params), torch.autograd.grad(shared.sum(), params), strict=True
    ):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-4)
