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
