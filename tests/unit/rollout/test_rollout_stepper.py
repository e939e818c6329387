"""The fast Llama stepper computes what the HF forward computes (Llama with GQA, Qwen2 with q/k/v bias)."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from tandem.models import positions_from_mask
from tandem.models.int8 import quantize_int8
from tandem.rollout.llama_decode import LlamaStepper, supports_fast_decode
from tandem.rollout.stepper import HFStepper

SMALL = {"vocab_size": 40, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2}


def _model(cls, config_cls, **kwargs):
    torch.manual_seed(0)
    return cls(config_cls(**SMALL, **kwargs)).eval()


MODELS = {
    "llama_gqa": lambda: _model(LlamaForCausalLM, LlamaConfig, num_attention_heads=4, num_key_value_heads=2),
    "qwen2_bias": lambda: _model(Qwen2ForCausalLM, Qwen2Config, num_attention_heads=2, num_key_value_heads=2),
    # an INT8 export's model: dynamic INT8 projections and head, called by the stepper as modules
    "llama_int8": lambda: quantize_int8(
        _model(LlamaForCausalLM, LlamaConfig, num_attention_heads=4, num_key_value_heads=2)
    ),
}


def _run(stepper, ids, mask, steps):
    """Prefill then feed ``steps`` fixed tokens; logits after each call, ``[steps + 1, B, V]``."""
    B, P = ids.shape
    attn = torch.cat([mask.long(), torch.ones((B, steps.shape[1]), dtype=torch.long)], dim=1)
    out = [stepper.prefill(ids, attn[:, :P], positions_from_mask(mask))]
    next_pos = mask.long().sum(1, keepdim=True)
    for t in range(steps.shape[1]):
        out.append(stepper.step(steps[:, t : t + 1], attn[:, : P + t + 1], next_pos + t))
    return torch.stack(out)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_fast_stepper_matches_hf_forward(name):
    model = MODELS[name]()
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 40, (3, 6), generator=gen)
    mask = torch.tensor([[0, 0, 0, 1, 1, 1], [1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 1]], dtype=torch.bool)
    ids = ids.masked_fill(~mask, 0)
    steps = torch.randint(1, 40, (3, 4), generator=gen)
    assert supports_fast_decode(model, max_len=10)
    with torch.inference_mode():
        ref = _run(HFStepper(model), ids, mask, steps)
        fast = _run(LlamaStepper(model, batch_size=3, max_len=10), ids, mask, steps)
    torch.testing.assert_close(fast, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_repeated_prompts_prefill_once_and_match_hf_forward(name):
    """Runs of identical rows (a prompt's n samples) are prefilled once and copied; every row then decodes
    its own tokens. Groups of 3, 1 and 2 rows, two of them padded, and after the first group a row with its
    ids but another mask (it must not be merged)."""
    model = MODELS[name]()
    gen = torch.Generator().manual_seed(2)
    base = torch.randint(1, 40, (3, 6), generator=gen)
    mask3 = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1]], dtype=torch.bool)
    counts = torch.tensor([3, 1, 2])
    ids = base.masked_fill(~mask3, 0).repeat_interleave(counts, dim=0)  # [6, 6]
    mask = mask3.repeat_interleave(counts, dim=0)
    ids = torch.cat([ids[:3], ids[:1], ids[3:]])  # row 3: rows 0-2's ids right after them, another mask
    mask = torch.cat([mask[:3], torch.ones((1, 6), dtype=torch.bool), mask[3:]])
    steps = torch.randint(1, 40, (7, 3), generator=gen)  # each row continues differently
    with torch.inference_mode():
        ref = _run(HFStepper(model, share_prefill=False), ids, mask, steps)
        fast = _run(LlamaStepper(model, batch_size=7, max_len=9), ids, mask, steps)
        hf, sizes = _forward_sizes(model, lambda: _run(HFStepper(model), ids, mask, steps))
    torch.testing.assert_close(fast, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(hf, ref, atol=1e-5, rtol=1e-5)
    assert sizes[0] == 4  # runs of 3, 1 (other mask), 1, 2: one prompt forward per run
    assert not torch.allclose(fast[0, 0], fast[0, 3])  # the different mask was prefilled apart


def _forward_sizes(model, run):
    """``run()`` and the batch size of each of the model's forwards, in order."""
    sizes = []
    hook = model.register_forward_pre_hook(
        lambda _m, _a, kw: sizes.append(kw["input_ids"].shape[0]), with_kwargs=True
    )
    try:
        return run(), sizes
    finally:
        hook.remove()


def test_hf_stepper_prefills_every_row_when_its_cache_cannot_select_rows(monkeypatch):
    """A cache without row selection (some hybrid caches) gets the plain prefill over all rows: the first
    call tries the shared prefill and falls back, later calls for that model class go straight there."""
    from transformers import DynamicCache

    def unsupported(self, indices):
        raise NotImplementedError

    class Model(LlamaForCausalLM):
        """A class of its own, so the learned fallback does not outlive the test."""

    torch.manual_seed(0)
    model = Model(LlamaConfig(**SMALL, num_attention_heads=4, num_key_value_heads=2)).eval()
    ids = torch.randint(1, 40, (1, 5), generator=torch.Generator().manual_seed(3)).repeat(3, 1)
    mask = torch.ones_like(ids, dtype=torch.bool)
    steps = torch.randint(1, 40, (3, 2), generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        ref = _run(HFStepper(model, share_prefill=False), ids, mask, steps)
        monkeypatch.setattr(DynamicCache, "batch_select_indices", unsupported)
        first, sizes = _forward_sizes(model, lambda: _run(HFStepper(model), ids, mask, steps))
        second, sizes2 = _forward_sizes(model, lambda: _run(HFStepper(model), ids, mask, steps))
    torch.testing.assert_close(first, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(second, ref, atol=1e-5, rtol=1e-5)
    assert sizes[:2] == [1, 3] and sizes2[0] == 3


class _WrappedLinear(torch.nn.Linear):
    """Stands in for an adapter-wrapped projection (e.g. LoRA) the fast path must not bypass."""


def test_unsupported_models_fall_back():
    model = MODELS["llama_gqa"]()
    assert supports_fast_decode(model, max_len=64)
    old = model.model.layers[1].self_attn.q_proj
    model.model.layers[1].self_attn.q_proj = _WrappedLinear(old.in_features, old.out_features, bias=False)
    assert not supports_fast_decode(model, max_len=64)
    mistral = _model(MistralForCausalLM, MistralConfig, num_attention_heads=2, sliding_window=16)
    assert supports_fast_decode(mistral, max_len=16)
    assert not supports_fast_decode(mistral, max_len=17)
