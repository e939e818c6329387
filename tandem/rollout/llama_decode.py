"""A faster decode path for Llama-family causal LMs (Llama, Mistral, Qwen2) with a preallocated KV cache.

Why: for small models the Hugging Face forward spends about a third of each decode step on Python-level
bookkeeping (mask construction, cache objects, module dispatch, output dataclasses), not arithmetic. This
stepper runs the same maths directly on the model's own weight tensors (no copies, so in-place optimiser
updates are seen at once), with a KV cache allocated once per generate call and written in place.

Naive equivalent: ``model(input_ids, attention_mask, position_ids, past_key_values=cache).logits[:, -1]``
with an HF ``DynamicCache``; the op order follows ``transformers``' ``modeling_llama`` (RMSNorm in float32,
rotary embedding from ``rotary_emb.inv_freq``, SDPA attention), so logits agree to float rounding.
:func:`supports_fast_decode` says when it applies; anything else (other architectures, LoRA-wrapped
projections, dynamic RoPE, sliding windows shorter than the sequence) uses the HF stepper. Projections may
be plain ``nn.Linear`` or dynamic INT8 linears (an INT8 export, :mod:`tandem.models.int8`): the stepper
calls each projection module on the same input the HF forward gives it, so either kind computes what
the model computes. Without this, an INT8 model paid the HF forward's Python bookkeeping on top of its
quantisation overhead at every decode step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel

from tandem.rollout.stepper import prompt_runs

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
STATIC_ROPE_TYPES = ("default", "linear", "llama3")  # inv_freq fixed at init; dynamic types change it
_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP = ("gate_proj", "up_proj", "down_proj")


def _linear_types() -> tuple[type, ...]:
    """Module types the stepper may call as a projection: ``nn.Linear`` and the dynamic INT8 Linear."""
    from torch.ao.nn.quantized.dynamic import Linear as DynamicInt8Linear

    return (nn.Linear, DynamicInt8Linear)


def supports_fast_decode(model: PreTrainedModel, max_len: int) -> bool:
    """Whether :class:`LlamaStepper` computes exactly what ``model`` computes for sequences of up to
    ``max_len`` tokens (``nn.Linear`` or dynamic INT8 projections, SiLU MLP, static RoPE, no active
    sliding window). Exact types: a wrapper (LoRA) around a Linear is not a Linear here."""
    linear = _linear_types()
    config = getattr(model, "config", None)
    base = getattr(model, "model", None)
    if config is None or base is None or getattr(config, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        return False
    if getattr(config, "hidden_act", None) != "silu" or type(getattr(model, "lm_head", None)) not in linear:
        return False
    rotary = getattr(base, "rotary_emb", None)
    if rotary is None or getattr(rotary, "rope_type", "default") not in STATIC_ROPE_TYPES:
        return False
    if not all(hasattr(base, name) for name in ("embed_tokens", "layers", "norm")):
        return False
    for layer in base.layers:
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        if attn is None or mlp is None:
            return False
        if any(type(getattr(attn, n, None)) not in linear for n in _PROJECTIONS):
            return False
        if any(type(getattr(mlp, n, None)) not in linear for n in _MLP):
            return False
        window = getattr(attn, "sliding_window", getattr(config, "sliding_window", None))
        if window is not None and max_len > window:
            return False
    return True


def _prefill_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Causal prefill mask over left-padded rows ``[B, P]`` -> ``[B, 1, P, P]`` bool: real queries see the
    real keys up to themselves; a padding query sees itself only (no empty softmax row, no NaN)."""
    P = attention_mask.shape[1]
    real = attention_mask.bool()  # [B, P]
    causal = torch.ones((P, P), dtype=torch.bool, device=attention_mask.device).tril()  # [P, P]
    eye = torch.eye(P, dtype=torch.bool, device=attention_mask.device)
    return (causal & real[:, None, None, :]) | eye


def _rms_norm(x: torch.Tensor, norm: nn.Module) -> torch.Tensor:
    """HF ``LlamaRMSNorm``: normalise in float32, cast back, then scale."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return norm.weight * x32.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LlamaStepper:
    """Prefill and single-token steps for a Llama-family model with a static per-call KV cache.

    The cache holds ``max_len`` positions per row: ``[B, kv_heads, max_len, head_dim]`` per layer. Rows are
    left padded; a padding query attends to itself only (so no softmax row is empty and no NaN reaches
    the cache), and real queries never attend padding.
    """

    def __init__(self, model: PreTrainedModel, batch_size: int, max_len: int) -> None:
        self.model = model
        self.base = model.model
        config = model.config
        attn0 = self.base.layers[0].self_attn
        self.head_dim = int(attn0.head_dim)
        self.n_heads = int(config.num_attention_heads)
        self.n_kv = int(getattr(config, "num_key_value_heads", None) or self.n_heads)
        self.scaling = float(getattr(attn0, "scaling", self.head_dim**-0.5))
        weight = self.base.embed_tokens.weight
        shape = (batch_size, self.n_kv, max_len, self.head_dim)
        # Uninitialised on purpose (naive equivalent: new_zeros): attention reads only positions
        # [0, length), and every one of them is written first, so zero-filling is wasted memory traffic.
        self.keys = [weight.new_empty(shape) for _ in self.base.layers]  # each [B, kv, L, D]
        self.values = [weight.new_empty(shape) for _ in self.base.layers]
        self.length = 0  # positions filled so far

    def prefill(
        self, ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor:
        """Run the prompts into an empty cache; logits of the last position ``[B, V]``.

        A run of identical consecutive rows (a prompt repeated for its ``n`` samples) is computed once and
        its cache entries and logits are copied to every row of the run, as vLLM's prefix cache shares a
        prompt between its samples: a group of ``n`` costs one prompt forward, not ``n``. Naive equivalent:
        the forward over all ``B`` rows (the same maths per row; only the matmuls' batch size differs)."""
        self.length = 0
        P = ids.shape[1]
        counts = prompt_runs(ids, attention_mask, position_ids)  # [N]
        if counts is None:
            return self._forward(ids, position_ids, _prefill_mask(attention_mask))
        first = torch.cumsum(counts, 0) - counts  # [N] the first row of each run
        full = self.keys, self.values
        N = first.numel()
        self.keys = [k.new_empty((N, k.shape[1], P, k.shape[3])) for k in full[0]]  # each [N, kv, P, D]
        self.values = [v.new_empty((N, v.shape[1], P, v.shape[3])) for v in full[1]]
        try:
            logits = self._forward(ids[first], position_ids[first], _prefill_mask(attention_mask[first]))
            for big, small in zip(full[0] + full[1], self.keys + self.values, strict=True):
                big[:, :, :P] = small.repeat_interleave(counts, dim=0)
        finally:
            self.keys, self.values = full
        return logits.repeat_interleave(counts, dim=0)  # [B, V]

    def step(
        self, ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor:
        """Append one token per row; logits after it ``[B, V]``."""
        mask = attention_mask.bool()[:, None, None, :]  # [B, 1, 1, L]
        return self._forward(ids, position_ids, mask)

    def select(self, index: torch.Tensor) -> bool:
        """Keep (and repeat) the cache rows ``index`` ``[S]``: the next step runs ``S`` rows."""
        self.keys = [k.index_select(0, index) for k in self.keys]
        self.values = [v.index_select(0, index) for v in self.values]
        return True

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``S`` new tokens per row (ids, positions ``[B, S]``), mask ``[B, 1, S, length + S]``."""
        x = F.embedding(ids, self.base.embed_tokens.weight)  # [B, S, H]
        cos, sin = self._rotary(positions, x.dtype)  # [B, 1, S, D] each
        end = self.length + ids.shape[1]
        for i, layer in enumerate(self.base.layers):
            x = x + self._attention(layer.self_attn, _rms_norm(x, layer.input_layernorm), cos, sin, mask, i)
            h = _rms_norm(x, layer.post_attention_layernorm)
            mlp = layer.mlp
            x = x + mlp.down_proj(F.silu(mlp.gate_proj(h)) * mlp.up_proj(h))
        self.length = end
        last = _rms_norm(x[:, -1], self.base.norm)  # [B, H]
        return self.model.lm_head(last)  # [B, V]

    def _rotary(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """HF rotary embedding: ``cos``/``sin`` of ``positions * inv_freq``, ``[B, 1, S, D]`` each."""
        rotary = self.base.rotary_emb
        freqs = positions[..., None].float() * rotary.inv_freq.float()  # [B, S, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [B, S, D]
        scale = getattr(rotary, "attention_scaling", 1.0)
        cos, sin = (emb.cos() * scale).to(dtype), (emb.sin() * scale).to(dtype)
        return cos[:, None], sin[:, None]

    def _attention(
        self,
        attn: nn.Module,
        h: torch.Tensor,  # [B, S, H] normalised input
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor,  # [B, 1, S, start + S] bool
        layer: int,
    ) -> torch.Tensor:  # [B, S, H]
        B, S, _ = h.shape
        D, start = self.head_dim, self.length
        q = attn.q_proj(h).view(B, S, self.n_heads, D).transpose(1, 2)  # [B, nh, S, D]
        k = attn.k_proj(h).view(B, S, self.n_kv, D).transpose(1, 2)  # [B, kv, S, D]
        v = attn.v_proj(h).view(B, S, self.n_kv, D).transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        self.keys[layer][:, :, start : start + S] = k
        self.values[layer][:, :, start : start + S] = v
        keys = self.keys[layer][:, :, : start + S]  # [B, kv, start+S, D]
        values = self.values[layer][:, :, : start + S]
        gqa = {"enable_gqa": True} if self.n_kv != self.n_heads else {}
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.scaling, **gqa)
        return attn.o_proj(out.transpose(1, 2).reshape(B, S, self.n_heads * D))
