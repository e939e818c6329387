"""Tiny Llama folders whose answers are set by hand, not trained: fixtures whose quality cannot depend on
where a training run lands on some machine (imported by test modules; ``tests/`` is on ``sys.path``
through its ``conftest.py``).

:func:`bigram_model` builds an ordinary ``LlamaForCausalLM`` (one layer, character tokenizer, safetensors
folder) that is exactly a bigram Markov chain: the attention and MLP output projections are zero, so the
residual stream at a position is the one-hot embedding of that position's token; the final RMSNorm scales
it to ``sqrt(H)``; the untied LM head column of that token holds the next-token logits divided by
``sqrt(H)``. The next token therefore depends on the current token only, with the logits given, and
greedy decoding follows the table deterministically. Every code path that loads, generates with and
judges a real checkpoint runs unchanged on it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import torch
from transformers import LlamaForCausalLM

from tandem.models import build_char_tokenizer, save_pretrained_atomic, tiny_llama_config

SURE = 30.0  # logit of a token the table names alone: every other token then has probability < 1e-11

Table = Mapping[str, Mapping[str, float] | str]


def bigram_model(out_dir: str | Path, table: Table) -> Path:
    """Save a tiny Llama whose next-token logits after character ``c`` are ``table[c]``, at ``out_dir``.

    ``table[c]`` is either the one next character (``"</s>"`` for end of sequence) or a mapping from next
    characters to logits (so ``{"y": 0.0, "n": 0.0}`` is a fair coin); unlisted next tokens get logit
    ``-SURE``. After a character the table does not name, the model ends the sequence.
    """
    tok = build_char_tokenizer()
    vocab = len(tok)
    hidden = 1 << math.ceil(math.log2(vocab))  # one embedding axis per token
    config = tiny_llama_config(
        vocab,
        hidden_size=hidden,
        num_layers=1,
        num_heads=2,
        intermediate_size=8,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    config.tie_word_embeddings = False
    with torch.random.fork_rng(devices=[]):  # the unused weights' random init leaves the global RNG alone
        model = LlamaForCausalLM(config)
    head = torch.full((vocab, vocab), -SURE)  # [next, current] logits
    head[tok.eos_token_id] = SURE  # default: end the sequence
    for char, nxt in table.items():
        cur = _id(tok, char)
        head[:, cur] = -SURE
        for c, logit in ({nxt: SURE} if isinstance(nxt, str) else nxt).items():
            head[_id(tok, c), cur] = logit
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(torch.eye(vocab, hidden))
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.norm.weight.fill_(1.0)
        model.lm_head.weight.zero_()
        model.lm_head.weight[:, :vocab] = head / math.sqrt(hidden)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    return save_pretrained_atomic(model, tok, out_dir)


def answer_chain(word: str) -> dict[str, str]:
    """Table entries that, once the first character of ``word`` is emitted, spell the rest and stop.
    The characters of ``word`` must be distinct (a bigram cannot count)."""
    if len(set(word)) != len(word):
        raise ValueError(f"{word!r} repeats a character")
    return {a: b for a, b in zip(word, [*word[1:], "</s>"], strict=True)}


def _id(tok, char: str) -> int:
    ids = tok.convert_tokens_to_ids([char])
    if ids[0] == tok.unk_token_id:
        raise ValueError(f"{char!r} is not in the character vocabulary")
    return ids[0]
