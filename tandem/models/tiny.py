"""Small models built from scratch, for tests, demos and benchmarks: a tiny Llama with a character
tokenizer (:func:`init_tiny_model`, the default), or a Llama- or Qwen2-architecture model with a byte-level
BPE tokenizer and a ChatML chat template (:func:`init_model`), from ~1M to ~100M parameters.

The result is an ordinary Hugging Face folder (``config.json``, ``model.safetensors``, tokenizer files)
that ``AutoModelForCausalLM`` / ``AutoTokenizer`` load offline, so every code path that handles real
checkpoints is exercised by the tiny one too.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    PretrainedConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
)

from tandem.errors import ConfigError, ModelError
from tandem.models.bpe import DEFAULT_VOCAB_SIZE, IM_END, build_bpe_tokenizer
from tandem.models.loading import save_pretrained_atomic
from tandem.models.tokenizer import build_char_tokenizer

ARCHITECTURES = {"llama": LlamaConfig, "qwen2": Qwen2Config}
TOKENIZERS = ("char", "bpe")
_BPE_STYLE = {"llama": "llama3", "qwen2": "qwen2"}  # each family splits digits its own way


def check_model_sizes(
    *,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int | None = None,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 256,
) -> None:
    """Refuse sizes that would build a broken model, in one line naming the ``tandem init-model`` option.

    Without this, 0 heads or 0 hidden units die in a ZeroDivisionError, an odd head size in a transformers
    validation traceback, and 0 layers/positions or a head size of 1 build a folder that only fails later
    (``tandem eval``: rotary embeddings need an even head size). ``None`` for ``num_kv_heads`` /
    ``intermediate_size`` means "the default"; an explicit 0 is refused, not silently replaced by it.
    """
    given = {
        "--hidden-size": hidden_size,
        "--num-layers": num_layers,
        "--num-heads": num_heads,
        "--num-kv-heads": num_kv_heads,
        "--intermediate-size": intermediate_size,
        "--max-position-embeddings": max_position_embeddings,
    }
    for option, value in given.items():
        if value is not None and value < 1:
            raise ConfigError(f"must be at least 1, got {value}", where=option)
    if hidden_size % num_heads != 0:
        raise ConfigError(
            f"hidden size {hidden_size} is not divisible by num_heads {num_heads}",
            where="--hidden-size",
            hint="pick --num-heads that divides --hidden-size",
        )
    head_dim = hidden_size // num_heads
    if head_dim % 2 != 0:
        raise ConfigError(
            f"head size {hidden_size} / {num_heads} = {head_dim} is odd; rotary position embeddings need "
            "an even one",
            where="--hidden-size",
            hint="pick --hidden-size and --num-heads whose quotient is even, e.g. 32 or more for vLLM",
        )
    if num_kv_heads is not None and num_heads % num_kv_heads != 0:
        raise ConfigError(
            f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}",
            where="--num-kv-heads",
            hint="pick --num-kv-heads that divides --num-heads",
        )


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
    check_model_sizes(
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
    )
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=4 * hidden_size if intermediate_size is None else intermediate_size,
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


def small_model_config(
    arch: str,
    vocab_size: int,
    *,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int | None = None,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 256,
    pad_token_id: int = 0,
    bos_token_id: int = 1,
    eos_token_id: int = 2,
) -> PretrainedConfig:
    """A small config of architecture ``arch`` (``llama`` or ``qwen2``): tied embeddings, MLP width
    ``4 * hidden_size`` unless given, ``num_kv_heads`` (grouped-query attention) defaulting to
    ``num_heads``. Qwen2 differs from Llama by biases on the q/k/v projections; sliding window is off.
    """
    _check_choice("architecture", arch, tuple(ARCHITECTURES), "--arch")
    check_model_sizes(
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
    )
    kv_heads = num_heads if num_kv_heads is None else num_kv_heads
    return ARCHITECTURES[arch](
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=4 * hidden_size if intermediate_size is None else intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=pad_token_id,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
    )


def init_model(
    out_dir: str | os.PathLike,
    *,
    arch: str = "llama",
    tokenizer: str = "char",
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int | None = None,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 256,
    seed: int = 0,
    created_by: str = "tandem init-model",
) -> Path:
    """Build a randomly initialised ``arch`` model with a ``tokenizer`` (``char`` or byte-level ``bpe`` of
    ``vocab_size`` entries, see :mod:`tandem.models.bpe`) and save it like :func:`init_tiny_model`.

    ``llama`` + ``char`` with default heads *is* :func:`init_tiny_model` (bit-identical weights and
    files). With ``bpe`` the generation config stops on ``<|endoftext|>`` and ``<|im_end|>``, so plain
    completions and chat answers both end. Keep ``hidden_size / num_heads >= 32`` for vLLM's CPU kernels.
    Returns ``out_dir``.
    """
    _check_choice("architecture", arch, tuple(ARCHITECTURES), "--arch")
    _check_choice("tokenizer", tokenizer, TOKENIZERS, "--tokenizer")
    check_model_sizes(
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
    )  # before the (seconds-long) BPE training and before anything is written
    if arch == "qwen2" and tokenizer == "char":
        raise ModelError(
            "a qwen2 model needs --tokenizer bpe",
            where="--arch",
            hint="transformers loads every qwen2 folder with Qwen2Tokenizer, which rebuilds a byte-level BPE "
            "pipeline and drops a character vocabulary's spaces; use --arch llama for a char model",
        )
    sizes = {"hidden_size": hidden_size, "num_layers": num_layers, "num_heads": num_heads}
    sizes |= {"intermediate_size": intermediate_size, "max_position_embeddings": max_position_embeddings}
    if arch == "llama" and tokenizer == "char" and num_kv_heads in (None, num_heads):
        return init_tiny_model(out_dir, seed=seed, created_by=created_by, **sizes)
    if tokenizer == "char":
        tok = build_char_tokenizer()
    else:
        tok = build_bpe_tokenizer(vocab_size, style=_BPE_STYLE[arch])
    config = small_model_config(arch, len(tok), num_kv_heads=num_kv_heads, **_special_ids(tok), **sizes)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
    stops = [tok.eos_token_id] + ([tok.convert_tokens_to_ids(IM_END)] if tokenizer == "bpe" else [])
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.bos_token_id = tok.bos_token_id
    model.generation_config.eos_token_id = stops if len(stops) > 1 else stops[0]
    return save_pretrained_atomic(model, tok, out_dir, created_by=created_by)


def _special_ids(tok: PreTrainedTokenizerFast) -> dict[str, int]:
    return {
        "pad_token_id": tok.pad_token_id,
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": tok.eos_token_id,
    }


def _check_choice(what: str, value: str, valid: tuple[str, ...], where: str) -> None:
    if value not in valid:
        raise ModelError(f"unknown {what} '{value}'", where=where, hint=f"use one of {', '.join(valid)}")
