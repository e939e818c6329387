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
from dataclasses import dataclass
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


# ----------------------------------------------------------------------------------- training on chats

ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})


def message_problem(value: Any, name: str) -> str | None:
    """Why ``value`` (field ``name``) is not a list of ``{role, content}`` messages with known roles and
    string contents, or None."""
    if not isinstance(value, list) or not value:
        return f"field '{name}' must be a non-empty list of {{role, content}} messages"
    for i, msg in enumerate(value):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            return f"field '{name}' message {i} is not a {{role, content}} object (no string 'role')"
        if msg["role"] not in ROLES:
            return f"field '{name}' message {i} has unknown role {msg['role']!r} (known: {', '.join(sorted(ROLES))})"
        if not isinstance(msg.get("content"), str):
            return f"field '{name}' message {i} has no string 'content'"
    return None


@dataclass(frozen=True)
class ChatRow:
    """A conversation to train on: the assistant turns from message ``train_from`` on are trained, every
    other token is context. TRL's ``messages`` rows train all assistant turns (``train_from = 0``); its
    conversational prompt/completion rows train the completion (``train_from = len(prompt)``)."""

    messages: tuple[dict[str, str], ...]
    train_from: int
    where: str  # "file:LINE", for errors


@dataclass(frozen=True)
class RenderedChat:
    """A conversation as the chat template renders it, cut into ``(text, trained)`` pieces whose
    concatenation is exactly the template's text."""

    pieces: tuple[tuple[str, bool], ...]


def chat_row(row: dict[str, Any], where: str) -> ChatRow | None:
    """The conversation of a TRL conversational SFT row (``messages``, or ``prompt`` + ``completion``
    message lists), None for a string row. DataError at ``where`` naming the field for a malformed one.
    A row with string ``prompt`` and ``completion`` is a string row even when it also carries
    ``messages`` (``tandem data export-conversations`` writes both; the strings are what the model read
    and wrote, tool calls rendered)."""
    prompt, completion = row.get("prompt"), row.get("completion")
    if isinstance(prompt, str) and isinstance(completion, str):
        return None
    if "messages" in row:
        problem = message_problem(row["messages"], "messages")
        if problem:
            raise DataError(problem, where=where)
        msgs = tuple(row["messages"])
        if not any(m["role"] == "assistant" for m in msgs):
            raise DataError("field 'messages' has no assistant turn to train on", where=where)
        return ChatRow(msgs, 0, where)
    if not (isinstance(prompt, list) or isinstance(completion, list)):
        return None
    for name, value in (("prompt", prompt), ("completion", completion)):
        problem = message_problem(value, name)
        if problem:
            raise DataError(problem, where=where)
    if not any(m["role"] == "assistant" for m in completion):  # type: ignore[union-attr]
        raise DataError("field 'completion' has no assistant turn to train on", where=where)
    return ChatRow((*prompt, *completion), len(prompt), where)  # type: ignore[misc]


def _template(tokenizer: Any, messages: Sequence[dict[str, str]], generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(
        list(messages), tokenize=False, add_generation_prompt=generation_prompt
    )


def require_template(tokenizer: Any, where: str) -> None:
    """DataError at ``where`` when ``tokenizer`` has no chat template (conversational data needs one)."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise DataError(
            "the row is a conversation (message lists) but the model's tokenizer has no chat template",
            where=where,
            hint="use a model with a chat_template (e.g. `tandem init-model --tokenizer bpe`) or string rows",
        )


def render_training(tokenizer: Any, chat: ChatRow) -> RenderedChat:
    """``chat`` through the chat template, with its trained assistant turns marked.

    Assistant turn ``i`` spans, in the full text, from the end of ``template(messages[:i],
    add_generation_prompt=True)`` (so the generation prompt ``<|im_start|>assistant\\n`` is context) to
    the end of ``template(messages[:i + 1])`` (so the turn's end-of-turn marker is trained, as TRL's
    completion-only loss does). Each rendering must be a prefix of the next, otherwise DataError: a
    template that rewrites earlier turns has no single text to cut."""
    require_template(tokenizer, chat.where)
    msgs = chat.messages
    full = _template(tokenizer, msgs, False)
    pieces: list[tuple[str, bool]] = []
    cur = 0
    for i, m in enumerate(msgs):
        if i < chat.train_from or m["role"] != "assistant":
            continue
        before, through = _template(tokenizer, msgs[:i], True), _template(tokenizer, msgs[: i + 1], False)
        if not (full.startswith(through) and through.startswith(before) and len(before) >= cur):
            raise DataError(
                f"the chat template does not render message {i} (assistant) as an extension of the turns "
                "before it, so its tokens cannot be marked",
                where=chat.where,
            )
        if before[cur:]:
            pieces.append((before[cur:], False))
        pieces.append((through[len(before) :], True))
        cur = len(through)
    if full[cur:]:
        pieces.append((full[cur:], False))
    return RenderedChat(tuple(pieces))


def render_completion(
    tokenizer: Any, prompt: Sequence[dict[str, str]], completion: Sequence[dict[str, str]], where: str
) -> tuple[str, str]:
    """``(prompt_text, completion_text)`` of a conversational preference side, as TRL renders it:
    ``template(prompt, add_generation_prompt=True)`` and the rest of ``template(prompt + completion)``."""
    require_template(tokenizer, where)
    head = _template(tokenizer, prompt, True) if prompt else ""  # an implicit prompt may share no message
    full = _template(tokenizer, [*prompt, *completion], False)
    if not full.startswith(head):
        raise DataError(
            "the chat template's rendering of prompt + completion does not start with the prompt's",
            where=where,
        )
    return head, full[len(head) :]
