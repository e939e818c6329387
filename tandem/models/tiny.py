"""Tiny Llama-architecture models with a character tokenizer, for tests, demos and benchmarks.

The result is an ordinary Hugging Face folder (``config.json``, ``model.safetensors``, tokenizer files)
that ``AutoModelForCausalLM`` / ``AutoTokenizer`` load offline, so every code path that handles real
checkpoints is exercised by the tiny one too.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tandem.errors import ModelError
from tandem.models.loading import save_pretrained_atomic
from tandem.models.tokenizer import build_char_tokenizer


def tiny_llama_config(
    vocab_size: int,
    *,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 256,
    pad_token_id: int = 0,
    bos_token_id: int = 1,
    eos_token_id: int = 2,
) -> LlamaConfig:
    """A small ``LlamaConfig``: tied embeddings, MLP width ``4 * hidden_size`` unless given.

    With the default character vocabulary (100 tokens) and defaults here the model has ~1.06M parameters.
    """
    if hidden_size % num_heads != 0:
        raise ModelError(
            f"hidden_size {hidden_size} is not divisible by num_heads {num_heads}",
            hint="pick num_heads that divides hidden_size",
        )
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=pad_token_id,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
    )


def init_tiny_model(
    out_dir: str | os.PathLike,
    *,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 256,
    seed: int = 0,
    chars: str | None = None,
    created_by: str = "tandem init-model",
) -> Path:
    """Build a randomly initialised tiny ``LlamaForCausalLM`` with a character tokenizer over ``chars``
    and save it atomically as a Hugging Face folder at ``out_dir``: an empty folder or an earlier Tandem
    model folder there is replaced, anything else refused (see :func:`save_pretrained_atomic`).

    Initialisation is seeded by ``seed`` without touching the global RNG state. Returns ``out_dir``.
    """
    tokenizer = build_char_tokenizer(chars)
    config = tiny_llama_config(
        len(tokenizer),
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    return save_pretrained_atomic(model, tokenizer, out_dir, created_by=created_by)
