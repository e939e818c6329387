"""Encoder classifiers (BERT/RoBERTa-style) as reward models, beside the causal-LM reward heads.

A reward-model folder is one of two kinds, read from its ``config.json`` (:func:`reward_model_kind`):

- ``causal`` — a decoder-only LM (Llama, Qwen2, GPT-2...) with a scalar ``score`` head: the sequence is
  ``prompt + completion + EOS`` left padded and the score is read at the last token
  (:mod:`tandem.train.rm`);
- ``encoder`` — an encoder-only model pretrained with masked LM (BERT, RoBERTa, DeBERTa, ELECTRA...)
  loaded by ``AutoModelForSequenceClassification`` with one label: the prompt and completion are encoded
  as a *pair* by the RM's own tokenizer (``[CLS] prompt [SEP] completion [SEP]``, segment ids telling
  them apart where the model has them), right padded, and the score is the classifier's logit, pooled
  the model's own way (the first token for BERT/RoBERTa).

The kind comes from the model type, not from the architectures list: a hub encoder folder says
``BertForMaskedLM`` or ``BertModel``, a trained RM says ``BertForSequenceClassification``, and both are
encoders; ``LlamaForSequenceClassification`` is a causal LM. Encoder-decoder models (BART, T5) and types
without a sequence-classification head are neither kind and are refused with one line.

Right padding, because BERT numbers positions from the first column: left padding would shift every
real token's position embedding by the pad count and the score would depend on the batch. Pairs longer
than the model's positions are truncated ``longest_first`` (HF's default for pairs), so a long prompt
gives up its tail before the completion is cut.

:func:`build_tiny_encoder` makes a small encoder folder offline (a WordPiece tokenizer trained with the
``tokenizers`` library on the caller's texts; BERT or RoBERTa layout) for tests and experiments.
"""

from __future__ import annotations

import os
import string
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from tandem.errors import ModelError
from tandem.models.loading import load_tokenizer, save_pretrained_atomic

RMKind = Literal["causal", "encoder"]
ENCODER_ARCHS = ("bert", "roberta")
SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")  # ids 0..4
ALPHABET = string.ascii_letters + string.digits + string.punctuation


def reward_model_kind(config: Any, *, where: str = "") -> RMKind:
    """``"causal"`` or ``"encoder"`` for a model config; ModelError (one line) when it is neither."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
        MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
    )

    model_type = getattr(config, "model_type", None) or "unknown"
    if model_type in MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES and not getattr(
        config, "is_encoder_decoder", False
    ):
        if model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES:  # BERT has a causal-LM head class too
            return "encoder"
        if model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
            return "causal"
    raise ModelError(
        f"model type '{model_type}' is neither a causal LM nor an encoder classifier",
        where=where or None,
        hint="a reward model starts from a decoder-only LM (Llama, Qwen2) or an encoder (BERT, RoBERTa)",
    )


def is_encoder(model: torch.nn.Module) -> bool:
    """Whether a loaded sequence-classification model is an encoder reward model."""
    return reward_model_kind(model.config) == "encoder"


def load_encoder_tokenizer(path: str | os.PathLike) -> Any:
    """The folder's tokenizer with right padding (positions count from the first column)."""
    tokenizer = load_tokenizer(path)
    tokenizer.padding_side = "right"
    return tokenizer


def max_pair_length(model: torch.nn.Module, tokenizer: Any) -> int:
    """Longest encoded pair the model takes: the tokenizer's ``model_max_length`` when it is set, else
    the model's position count (less RoBERTa's offset of ``pad_token_id + 1``)."""
    config = model.config
    positions = getattr(config, "max_position_embeddings", None) or 512
    if config.model_type in ("roberta", "xlm-roberta", "camembert", "roberta-prelayernorm", "xmod"):
        positions -= (config.pad_token_id or 0) + 1
    limit = tokenizer.model_max_length
    return positions if not limit or limit > 1_000_000 else min(limit, positions)


def encode_pairs(
    model: torch.nn.Module, tokenizer: Any, prompts: Sequence[str], completions: Sequence[str]
) -> Any:
    """``tokenizer(prompt, completion)`` per row, right padded and truncated to the model: a dict of
    ``[B, T]`` tensors (``input_ids``, ``attention_mask``, ``token_type_ids`` when the model has segments)."""
    enc = tokenizer(
        list(prompts),
        list(completions),
        padding=True,
        padding_side="right",  # whatever side the tokenizer was loaded with
        truncation="longest_first",
        max_length=max_pair_length(model, tokenizer),
        return_tensors="pt",
    )
    if "token_type_ids" in enc and getattr(model.config, "type_vocab_size", 2) < 2:
        del enc["token_type_ids"]  # one segment only (RoBERTa): segment ids of 1 would be out of range
    return enc


def encoder_scores(
    model: torch.nn.Module, tokenizer: Any, prompts: Sequence[str], completions: Sequence[str]
) -> torch.Tensor:
    """Scalar reward per pair ``[B]`` float32: the one-label classifier's logit."""
    enc = encode_pairs(model, tokenizer, prompts, completions)
    return model(**enc).logits[:, 0].float()  # [B]


def train_wordpiece(texts: Iterable[str], vocab_size: int = 512) -> Tokenizer:
    """A cased WordPiece ``tokenizers`` backend trained on ``texts``, every printable ASCII character in
    its alphabet, with BERT's pair template ``[CLS] A [SEP] B [SEP]`` (segment 1 for B)."""
    backend = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, special_tokens=list(SPECIALS), initial_alphabet=list(ALPHABET), min_frequency=1
    )
    backend.train_from_iterator(list(texts) + [ALPHABET], trainer=trainer)
    cls, sep = backend.token_to_id("[CLS]"), backend.token_to_id("[SEP]")
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    return backend


def build_tiny_encoder(
    out_dir: str | os.PathLike,
    texts: Iterable[str],
    *,
    arch: str = "bert",
    hidden_size: int = 32,
    num_layers: int = 2,
    num_heads: int = 2,
    vocab_size: int = 512,
    max_length: int = 128,
    seed: int = 0,
) -> Path:
    """Save a small randomly initialised encoder (``BertModel`` or ``RobertaModel``, no dropout) and its
    WordPiece tokenizer trained on ``texts`` as a Tandem model folder; ``tandem rm`` turns it into an
    encoder reward model. Loads offline with ``AutoTokenizer`` / ``AutoModelForSequenceClassification``."""
    from transformers import AutoModel, BertConfig, RobertaConfig

    if arch not in ENCODER_ARCHS:
        raise ModelError(f"unknown encoder architecture '{arch}'", hint=f"use one of {list(ENCODER_ARCHS)}")
    backend = train_wordpiece(texts, vocab_size)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        padding_side="right",
        model_max_length=max_length,
        model_input_names=["input_ids", "token_type_ids", "attention_mask"]
        if arch == "bert"
        else ["input_ids", "attention_mask"],
    )
    pad = tokenizer.pad_token_id
    common = dict(
        vocab_size=backend.get_vocab_size(), hidden_size=hidden_size, num_hidden_layers=num_layers,
        num_attention_heads=num_heads, intermediate_size=4 * hidden_size, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, pad_token_id=pad,
    )  # fmt: skip
    if arch == "bert":
        config: Any = BertConfig(max_position_embeddings=max_length, **common)
    else:  # RoBERTa numbers positions from pad_token_id + 1
        config = RobertaConfig(max_position_embeddings=max_length + pad + 1, type_vocab_size=1, **common)
    torch.manual_seed(seed)
    model: PreTrainedModel = AutoModel.from_config(config)
    return save_pretrained_atomic(model, tokenizer, out_dir, created_by="tandem.models.encoder")
