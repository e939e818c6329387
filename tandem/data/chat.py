"""Conversational prompts (TRL's format: a list of ``{"role", "content"}`` messages) for generation and
rewards.

An engine generates from text, so a message list goes through the tokenizer's chat template with the
generation prompt (``<|im_start|>assistant\\n`` in ChatML) before it is encoded; a string prompt is used as
is. The engine decodes completions with special tokens skipped, so the template's end-of-turn marker
(``<|im_end|>``) never reaches a reward. Rewards then see what TRL passes for conversational data: the
original message list as the prompt and ``[{"role": "assistant", "content": text}]`` as the completion;
for string prompts, strings.

The tokenizer is duck-typed (``apply_chat_template`` and ``chat_template``), so this layer imports no
model library.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tandem.errors import DataError

Prompt = str | list[dict[str, str]]


def is_conversational(prompt: Any) -> bool:
    """True for a message list (TRL's conversational format), False for a plain string."""
    return isinstance(prompt, list)


def render_prompts(tokenizer: Any, prompts: Sequence[Prompt], *, where: str = "data") -> list[str]:
    """Generation text of every prompt: strings unchanged, message lists through ``tokenizer``'s chat
    template with the generation prompt. DataError at ``where`` when a message list meets a tokenizer
    without a chat template (rendering it some other way would train on a format the model is never
    served with)."""
    if not any(is_conversational(p) for p in prompts):
        return list(prompts)  # type: ignore[arg-type]  (all strings)
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise DataError(
            "prompts are message lists but the model's tokenizer has no chat template",
            where=where,
            hint="use a model with a chat_template (e.g. `tandem init-model --tokenizer bpe`) or string prompts",
        )
    return [
        tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
        if is_conversational(p)
        else p
        for p in prompts
    ]


def reward_inputs(prompts: Sequence[Prompt], completions: Sequence[str]) -> tuple[list[Prompt], list[Any]]:
    """``(prompts, completions)`` as TRL hands them to reward functions: a conversational prompt keeps its
    message list and its completion becomes ``[{"role": "assistant", "content": completion}]``; a string
    prompt and its completion stay strings. ``prompts[i]`` belongs to ``completions[i]``."""
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts for {len(completions)} completions")
    wrapped = [
        [{"role": "assistant", "content": c}] if is_conversational(p) else c
        for p, c in zip(prompts, completions, strict=True)
    ]
    return list(prompts), wrapped
