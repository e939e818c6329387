"""Conversational data (TRL's ``messages`` and prompt/completion message lists) for SFT, DPO and RM on a
tiny Qwen2 model with a byte-level BPE tokenizer and a ChatML template: the loss mask covers exactly the
assistant tokens the template renders, `tandem sft` trains on such rows, preference rows render through
the template, and malformed rows are one-line errors naming file:line and field. Mechanism only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tandem.cli.sft_data import sft_pairs
from tandem.data.chat import ChatRow, RenderedChat, render_training
from tandem.data.preference import PreferencePair, validate_row
from tandem.errors import DataError
from tandem.models import build_char_tokenizer, init_model, load_causal_lm, load_tokenizer
from tandem.train.dpo import sequence_logps
from tandem.train.preference_batch import encode_preference_batch, pair_texts
from tandem.train.rm import load_reward_model, pairwise_accuracy
from tandem.train.sft import SFTSettings, encode_pairs, run_sft, sft_pair

SYS, U1, U2 = (
    {"role": "system", "content": "Answer only."},
    {"role": "user", "content": "12+7="},
    {"role": "user", "content": "3*4="},
)
A1, A2 = {"role": "assistant", "content": "19"}, {"role": "assistant", "content": "12"}


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory) -> Path:
    return init_model(
        tmp_path_factory.mktemp("chat") / "q", arch="qwen2", tokenizer="bpe", seed=1,
        hidden_size=32, num_layers=1, num_heads=2,
    )  # fmt: skip


@pytest.fixture(scope="module")
def tok(qwen2):
    return load_tokenizer(qwen2)


def _trained_and_all(tok, chat: RenderedChat) -> tuple[list[int], list[int]]:
    """(trained ids, every real id in order) of one encoded conversation."""
    p_ids, p_mask, r_ids, r_mask = encode_pairs(tok, [chat])
    return r_ids[0][r_mask[0]].tolist(), p_ids[0][p_mask[0]].tolist() + r_ids[0].tolist()


def test_messages_mask_covers_exactly_the_assistant_turns(tok):
    msgs = [SYS, U1, A1, U2, A2]
    chat = render_training(tok, sft_pair({"messages": msgs}, "f.jsonl:1"))
    full = tok.apply_chat_template(msgs, tokenize=False)
    assert "".join(t for t, _ in chat.pieces) == full  # the pieces are the template's text, cut
    trained, every = _trained_and_all(tok, chat)
    assert tok.decode(trained) == "19<|im_end|>\n12<|im_end|>\n"  # contents + end-of-turn, no header
    assert tok.decode(every) == full
    assert every == tok(full, add_special_tokens=False)["input_ids"]  # same ids as the whole text


def test_prompt_completion_rows_train_only_the_completion(tok):
    row = sft_pair({"prompt": [U1, A1, U2], "completion": [A2]}, "f.jsonl:2")
    assert isinstance(row, ChatRow) and row.train_from == 3
    trained, every = _trained_and_all(tok, render_training(tok, row))
    assert tok.decode(trained) == "12<|im_end|>\n"  # the assistant turn inside the prompt is context
    assert tok.decode(every) == tok.apply_chat_template([U1, A1, U2, A2], tokenize=False)
    assert sft_pair({"prompt": "12+7=", "completion": "19"}, "x") == ("12+7=", "19")  # strings unchanged
    exported = {
        "messages": [U1, {"role": "assistant", "content": None, "tool_calls": []}],
        "prompt": "p",
        "completion": "c",
    }
    assert sft_pair(exported, "x") == ("p", "c")  # export-conversations rows: their exact strings win


def test_sft_on_messages_lowers_the_loss(qwen2, tok):
    model = load_causal_lm(qwen2)
    rows = [sft_pair({"messages": [U1, A1]}, "a"), sft_pair({"messages": [SYS, U2, A2]}, "b"), ("5+5=", "10")]
    losses: list[float] = []
    run_sft(model, tok, rows, SFTSettings(steps=12, lr=1e-2, batch_size=3, warmup_steps=1),
            on_step=lambda _, m: losses.append(m["sft/loss"]))  # fmt: skip
    assert losses[-1] < losses[0]


def test_tandem_sft_cli_trains_on_messages_rows(tmp_path, qwen2):
    data = tmp_path / "chat.jsonl"
    data.write_text(
        json.dumps({"messages": [U1, A1]}) + "\n" + json.dumps({"prompt": [U2], "completion": [A2]}) + "\n"
    )
    from tandem.cli.main import app

    result = CliRunner().invoke(
        app, ["sft", str(qwen2), "--data", str(data), "--steps", "2", "--batch-size", "2",
              "--out", str(tmp_path / "out")],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert (tmp_path / "out" / "config.json").is_file()


@pytest.mark.parametrize(
    ("row", "needle"),
    [
        ({"messages": [{"content": "hi"}, A1]}, "field 'messages' message 0 is not a {role, content} object"),
        ({"messages": [U1, {"role": "assistant"}]}, "field 'messages' message 1 has no string 'content'"),
        ({"messages": [{"role": "robot", "content": "x"}, A1]}, "message 0 has unknown role 'robot'"),
        ({"messages": [SYS, U1]}, "field 'messages' has no assistant turn"),
        ({"messages": []}, "field 'messages' must be a non-empty list"),
        ({"prompt": [U1], "completion": [U2]}, "field 'completion' has no assistant turn"),
        ({"prompt": [U1], "completion": "19"}, "field 'completion' must be a non-empty list"),
    ],
)
def test_malformed_conversational_rows_are_one_line_errors(tmp_path, row, needle):
    data = tmp_path / "bad.jsonl"
    data.write_text(json.dumps({"messages": [U1, A1]}) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(DataError) as err:
        sft_pairs(data=data, task=None, train_size=0, seed=0)
    msg = str(err.value)
    assert f"{data}:2" in msg and needle in msg and "\n" not in msg


def test_conversations_without_a_chat_template_are_a_one_line_error(tiny_model_dir):
    model, chat = load_causal_lm(tiny_model_dir), sft_pair({"messages": [U1, A1]}, "data.jsonl:7")
    with pytest.raises(DataError, match="no chat template") as err:
        run_sft(model, build_char_tokenizer(), [chat], SFTSettings(steps=1))
    assert "data.jsonl:7" in str(err.value) and "\n" not in str(err.value)


def test_distill_refuses_conversational_rows_in_one_line(tmp_path):
    data = tmp_path / "c.jsonl"
    data.write_text(json.dumps({"messages": [U1, A1]}) + "\n")
    with pytest.raises(DataError, match="not supported here") as err:
        sft_pairs(data=data, task=None, train_size=0, seed=0, conversational=False)
    assert f"{data}:1" in str(err.value)


def _pair(row: dict) -> PreferencePair:
    pair = validate_row(row, "prefs.jsonl:1")
    assert isinstance(pair, PreferencePair), pair
    return pair


def test_preference_rows_render_through_the_template(tok):
    bad = {"role": "assistant", "content": "20"}
    explicit = _pair({"prompt": [SYS, U1], "chosen": [A1], "rejected": [bad]})
    implicit = _pair({"chosen": [SYS, U1, A1], "rejected": [SYS, U1, bad]})
    head = tok.apply_chat_template([SYS, U1], tokenize=False, add_generation_prompt=True)
    for pair in (explicit, implicit):
        assert pair_texts(tok, pair) == (head, "19<|im_end|>\n", "20<|im_end|>\n")
    p_ids, p_mask, r_ids, r_mask = encode_preference_batch(tok, [explicit, implicit])  # [4, P], [4, R]
    assert tok.decode(p_ids[0][p_mask[0]]) == head
    assert tok.decode(r_ids[0][r_mask[0]]) == "19<|im_end|>\n<|endoftext|>"  # + EOS, as TRL's DPO
    assert tok.decode(r_ids[2][r_mask[2]]) == "20<|im_end|>\n<|endoftext|>"


def test_dpo_and_rm_score_conversational_pairs(qwen2, tok):
    pairs = [_pair({"prompt": [U1], "chosen": [A1], "rejected": [{"role": "assistant", "content": "18"}]})]
    with torch.no_grad():
        chosen, rejected = sequence_logps(load_causal_lm(qwen2), tok, pairs)
    assert (
        torch.isfinite(chosen).all() and torch.isfinite(rejected).all() and chosen.item() != rejected.item()
    )
    rm, rm_tok = load_reward_model(qwen2, init_head=True)
    assert pairwise_accuracy(rm, rm_tok, pairs) in (0.0, 1.0)


def test_preference_rows_with_an_unknown_role_are_invalid():
    row = {"prompt": [{"role": "narrator", "content": "x"}], "chosen": [A1], "rejected": [A2]}
    bad = validate_row(row, "prefs.jsonl:3")
    assert not isinstance(bad, PreferencePair) and "unknown role 'narrator'" in bad.reason
