"""Turn preference pairs into token tensors for the reward model and DPO.

A conversational side (prompt and completion both message lists) goes through the tokenizer's chat
template when it has one, as TRL renders it (:func:`tandem.data.chat.render_completion`): the prompt with
the generation prompt, the completion the rest of ``template(prompt + completion)`` — the assistant
content and the template's end-of-turn marker (``<|im_end|>\\n`` in ChatML). Without a template (an
encoder reward model's tokenizer, a char-level model), and for plain strings, the text is used as is
(``role: content`` lines for a prompt, the assistant contents for a completion). Prompts are left padded
and completions right padded and closed with EOS, the same layout as
:func:`tandem.train.sft.encode_pairs` and the rollout engine, so log-probs agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from tandem.data.chat import render_completion
from tandem.data.preference import PreferencePair, Text, render
from tandem.train.sft import encode_pairs


def prompt_text(tokenizer: Any, prompt: Text) -> str:
    """A prompt as model input text: chat template (with generation prompt) for message lists when the
    tokenizer has one, else the plain rendering."""
    if isinstance(prompt, list) and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    return render(prompt)


def completion_text(completion: Text) -> str:
    """A completion as text: a string, or the joined contents of assistant messages."""
    if isinstance(completion, str):
        return completion
    return "\n".join(m["content"] for m in completion)


def side_texts(tokenizer: Any, prompt: Text, completion: Text, where: str = "data") -> tuple[str, str]:
    """``(prompt, completion)`` of one side of a pair as strings ready to tokenise: through the chat
    template when both are message lists and the tokenizer has one, else :func:`prompt_text` and
    :func:`completion_text`."""
    if (
        isinstance(prompt, list)
        and isinstance(completion, list)
        and getattr(tokenizer, "chat_template", None)
    ):
        return render_completion(tokenizer, prompt, completion, where)
    return prompt_text(tokenizer, prompt), completion_text(completion)


def pair_texts(tokenizer: Any, pair: PreferencePair) -> tuple[str, str, str]:
    """``(prompt, chosen, rejected)`` as strings ready to tokenise."""
    prompt, chosen = side_texts(tokenizer, pair.prompt, pair.chosen, pair.where)
    _, rejected = side_texts(tokenizer, pair.prompt, pair.rejected, pair.where)
    return prompt, chosen, rejected


def encode_preference_batch(
    tokenizer: Any, pairs: Sequence[PreferencePair]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Chosen rows then rejected rows, stacked: ``(prompt_ids [2B, P], prompt_mask [2B, P],
    response_ids [2B, R], response_mask [2B, R])``; row ``i`` is pair i's chosen, ``B + i`` its rejected."""
    texts = [pair_texts(tokenizer, p) for p in pairs]
    rows: list = [(p, c) for p, c, _ in texts] + [(p, r) for p, _, r in texts]
    return encode_pairs(tokenizer, rows)
