"""Character tokenizer: ids of special tokens, exact round trip (spaces kept), left padding."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tandem.models.tokenizer import DEFAULT_CHARS, build_char_tokenizer


def test_special_token_ids_and_vocab_size():
    tok = build_char_tokenizer()
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    assert len(tok) == 4 + len(set(DEFAULT_CHARS))
    assert tok.padding_side == "left"


def test_one_token_per_character_and_no_bos_added():
    tok = build_char_tokenizer()
    ids = tok("a b\n").input_ids
    assert len(ids) == 4
    assert tok.bos_token_id not in ids
    assert tok.convert_ids_to_tokens(ids) == ["a", " ", "b", "\n"]


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.text(alphabet=DEFAULT_CHARS, max_size=40))
def test_round_trip_keeps_spaces(text):
    tok = build_char_tokenizer()
    assert tok.decode(tok(text).input_ids, skip_special_tokens=True) == text


def test_special_tokens_skipped_on_decode_and_unknown_chars_map_to_unk():
    tok = build_char_tokenizer()
    ids = tok("  hi </s>").input_ids
    assert ids[-1] == tok.eos_token_id
    assert tok.decode(ids, skip_special_tokens=True) == "  hi "
    assert tok("é").input_ids == [tok.unk_token_id]


def test_custom_charset_and_left_padding():
    tok = build_char_tokenizer("ab ")
    assert len(tok) == 7
    batch = tok(["a", "ab b"], padding=True)
    assert batch.input_ids[0] == [0, 0, 0, tok.convert_tokens_to_ids("a")]
    assert batch.attention_mask[0] == [0, 0, 0, 1]
