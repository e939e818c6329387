"""Conversational prompts: rendered through the chat template with the generation prompt, strings left
alone, a one-line error without a template; rewards get TRL's conversational shapes and the built-in
rewards score them."""

from __future__ import annotations

import pytest

from tandem.data.chat import is_conversational, render_prompts, reward_inputs
from tandem.errors import DataError
from tandem.models import build_bpe_tokenizer, build_char_tokenizer
from tandem.rewards import format_regex, get_task

MESSAGES = [{"role": "system", "content": "Answer only."}, {"role": "user", "content": "12+7="}]


@pytest.fixture(scope="module")
def tok():
    return build_bpe_tokenizer()


def test_messages_go_through_the_template_and_strings_stay(tok):
    texts = render_prompts(tok, ["3+4=", MESSAGES])
    assert texts[0] == "3+4="
    assert texts[1] == (
        "<|im_start|>system\nAnswer only.<|im_end|>\n<|im_start|>user\n12+7=<|im_end|>\n<|im_start|>assistant\n"
    )
    assert render_prompts(None, ["a", "b"]) == ["a", "b"]  # strings need no tokenizer


def test_messages_without_a_chat_template_are_a_one_line_error():
    with pytest.raises(DataError, match="no chat template") as err:
        render_prompts(build_char_tokenizer(), [MESSAGES], where="data.train_file")
    assert "data.train_file" in str(err.value) and "\n" not in str(err.value)


def test_reward_inputs_follow_trl_conversational_shapes():
    prompts, completions = reward_inputs([MESSAGES, "3+4="], ["19", "7"])
    assert prompts == [MESSAGES, "3+4="]
    assert completions == [[{"role": "assistant", "content": "19"}], "7"]
    assert is_conversational(MESSAGES) and not is_conversational("x")
    with pytest.raises(ValueError):
        reward_inputs([MESSAGES], [])


def test_built_in_rewards_score_conversational_completions():
    _, completions = reward_inputs([MESSAGES] * 3, ["19\nextra", " 18", "19"])
    assert get_task("arith").reward([MESSAGES] * 3, completions, answer=["19"] * 3) == [1.0, 0.0, 1.0]
    assert format_regex(r"\d+")([MESSAGES] * 3, completions) == [0.0, 1.0, 1.0]
