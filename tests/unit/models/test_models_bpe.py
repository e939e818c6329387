"""Byte-level BPE tokenizer: exact round trip, multi-character number tokens (Llama 3 style) or one token
per digit (Qwen2 style), special tokens, the ChatML template with and without a generation prompt,
determinism."""

from __future__ import annotations

import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tandem.errors import ModelError
from tandem.models.bpe import CHAT_TEMPLATE, SPECIAL_TOKENS, build_bpe_tokenizer, task_corpus
from tandem.rewards.tasks import get_task

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "12+7="}]


@functools.cache
def _built(style: str):
    """One tokenizer per style for the module (hypothesis examples cannot take a fixture)."""
    return build_bpe_tokenizer(style=style)


@pytest.fixture
def llama3():
    return _built("llama3")


@pytest.fixture
def qwen2():
    return _built("qwen2")


def test_size_and_special_token_ids(llama3):
    assert len(llama3) == 512
    ids = llama3.convert_tokens_to_ids(list(SPECIAL_TOKENS))
    assert ids == [0, 1, 2, 3, 4]
    assert (llama3.pad_token_id, llama3.bos_token_id, llama3.eos_token_id) == (0, 1, 1)
    assert llama3.padding_side == "left"


@pytest.mark.parametrize("style", ["llama3", "qwen2"])
def test_task_text_round_trips_without_bos(style, llama3, qwen2):
    tok = {"llama3": llama3, "qwen2": qwen2}[style]
    for line in task_corpus(rows_per_task=32):
        ids = tok(line).input_ids
        assert tok.bos_token_id not in ids and tok.unk_token_id not in ids
        assert tok.decode(ids) == line


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.text(max_size=40))
def test_any_text_round_trips(text):
    tok = _built("llama3")
    assert tok.decode(tok(text).input_ids, skip_special_tokens=True) == text


def test_llama3_style_merges_multi_digit_numbers(llama3):
    rows = get_task("arith", digits=2).make_rows("test", 64, seed=5)
    pieces = [p for r in rows for p in llama3.tokenize(r["prompt"] + r["answer"])]
    multi = [p for p in pieces if p.isdigit() and len(p) > 1]
    assert len(multi) > len(rows)  # most 2-digit operands are single tokens
    assert max(len(llama3.tokenize(r["prompt"])) for r in rows) < max(len(r["prompt"]) for r in rows)


def test_qwen2_style_splits_every_digit(qwen2):
    assert qwen2.tokenize("504+17=521") == ["5", "0", "4", "+", "1", "7", "=", "5", "2", "1"]
    assert len(qwen2.tokenize("reverse abcde:")) < len("reverse abcde:")  # words still merge


def test_special_tokens_in_text_are_single_tokens(llama3):
    ids = llama3("<|im_start|>user\nhi<|im_end|>").input_ids
    assert ids[0] == llama3.convert_tokens_to_ids("<|im_start|>")
    assert ids[-1] == llama3.convert_tokens_to_ids("<|im_end|>")
    assert llama3.decode(ids, skip_special_tokens=True) == "user\nhi"


def test_chat_template_with_and_without_generation_prompt(llama3):
    assert llama3.chat_template == CHAT_TEMPLATE
    plain = llama3.apply_chat_template(MESSAGES, tokenize=False)
    assert plain == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n12+7=<|im_end|>\n"
    prompt = llama3.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert prompt == plain + "<|im_start|>assistant\n"
    ids = llama3.apply_chat_template(MESSAGES, add_generation_prompt=True, return_dict=False)
    assert ids == llama3(prompt).input_ids
    assert ids.count(llama3.convert_tokens_to_ids("<|im_start|>")) == 3


def test_training_is_deterministic(llama3):
    again = build_bpe_tokenizer(style="llama3")
    assert again.get_vocab() == llama3.get_vocab()
    assert again.backend_tokenizer.to_str() == llama3.backend_tokenizer.to_str()


def test_bad_arguments_are_one_line_errors():
    with pytest.raises(ModelError, match="too small"):
        build_bpe_tokenizer(100)
    with pytest.raises(ModelError, match="unknown BPE split style"):
        build_bpe_tokenizer(style="gpt2")
