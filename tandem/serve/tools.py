"""Tool calling in ``/v1/chat/completions``: OpenAI ``tools`` and ``tool_choice`` in, ``tool_calls`` out.

The request's function tools become declaration-only :class:`~tandem.agents.tool_calls.ToolSpec` s (the
client runs them). The prompt shows them the way the model was trained to see them: a chat template that
reads ``tools`` renders them itself (format ``hermes``); otherwise the server's tool-call format
(``tandem serve --tool-format``) writes them into the system message and writes earlier assistant
``tool_calls`` and ``tool`` messages as that format's call and result text. The answer is parsed in the
same format: well-formed calls of declared tools with valid arguments become ``tool_calls`` (each with a
fresh id, arguments as a JSON string) and ``finish_reason: "tool_calls"``; the rest of the text stays
``content`` (null when empty). Text that only looks like a call (bad JSON, an unknown tool, arguments
that break the schema) stays in ``content``, as other servers do.

``tool_choice``: ``none`` leaves the tools out of the prompt and parses nothing; ``auto`` lets the model
choose; ``required`` and a named function start the assistant turn with the format's call opening
(``<tool_call>\\n`` / ``CALL `` — plus the name for a named function), so generation continues inside a
call. That is a prompt prefix, not constrained decoding: a model that then writes a malformed call gets
its text back as content. Streaming with tools waits for the whole answer and sends it as one content
delta and one delta per call (clients accumulate deltas, so the result is the same).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from tandem.agents.tool_calls import ToolSpec, get_format, messages_as_text, template_takes_tools, tool_map
from tandem.errors import ConfigError
from tandem.serve.protocol import ApiError, ChatRequest

MAX_TOOLS = 128
_EMPTY_PARAMETERS = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ChatTools:
    """The tools of one chat request and how they are used."""

    specs: tuple[ToolSpec, ...] = ()
    choice: str = "none"  # none | auto | required | function
    function: str | None = None  # the forced function of choice "function"
    fmt: str = "hermes"
    parallel: bool = True

    @property
    def active(self) -> bool:
        """Whether tools are shown to the model and its answer is parsed for calls."""
        return bool(self.specs) and self.choice != "none"

    def prefix(self) -> str:
        """Text the assistant turn is made to start with (``required`` / a named function)."""
        hermes = self.fmt == "hermes"
        if self.choice == "function":
            return (
                f'<tool_call>\n{{"name": {json.dumps(self.function)}, "arguments": '
                if hermes
                else f"CALL {self.function}("
            )
        if self.choice == "required":
            return "<tool_call>\n" if hermes else "CALL "
        return ""

    def message(self, text: str) -> tuple[dict[str, Any], bool]:
        """The assistant message of generated ``text`` (after :meth:`prefix`) and whether it calls tools."""
        full = self.prefix() + text
        if not self.active:
            return {"role": "assistant", "content": full, "refusal": None}, False
        parsed = get_format(self.fmt).parse(full, tool_map(self.specs))
        calls = list(parsed.valid_calls)[: None if self.parallel else 1]
        if not calls:
            return {"role": "assistant", "content": full, "refusal": None}, False
        content = full
        for call in calls:
            content = content.replace(call.raw, "", 1)
        out = [
            {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
             "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
            for c in calls
        ]  # fmt: skip
        return {
            "role": "assistant",
            "content": content.strip() or None,
            "refusal": None,
            "tool_calls": out,
        }, True

    def declarations(self) -> list[dict[str, Any]]:
        """The tools in OpenAI's shape (for templates and recorded conversations)."""
        return [t.to_openai() for t in self.specs]


def chat_tools(req: ChatRequest, fmt: str) -> ChatTools:
    """The checked ``tools`` / ``tool_choice`` / ``parallel_tool_calls`` of ``req``; ApiError(400)
    naming the field for anything malformed."""
    specs = tuple(_spec(item, i) for i, item in enumerate(req.tools or []))
    if len(specs) > MAX_TOOLS:
        raise ApiError(400, f"{len(specs)} tools exceed the limit {MAX_TOOLS}", param="tools")
    seen: set[str] = set()
    for i, spec in enumerate(specs):
        if spec.name in seen:
            raise ApiError(400, f"tool '{spec.name}' is declared twice", param=f"tools.{i}.function.name")
        seen.add(spec.name)
    choice, function = _choice(req.tool_choice, seen)
    return ChatTools(specs, choice, function, fmt, req.parallel_tool_calls is not False)


def _spec(item: Any, i: int) -> ToolSpec:
    where = f"tools.{i}"
    if not isinstance(item, dict) or item.get("type") != "function":
        raise ApiError(400, "only tools of type 'function' are supported", param=f"{where}.type")
    fn = item.get("function")
    if not isinstance(fn, dict):
        raise ApiError(400, "a function tool needs a 'function' object", param=f"{where}.function")
    name, description = fn.get("name"), fn.get("description") or ""
    if not isinstance(name, str):
        raise ApiError(400, "the function needs a string 'name'", param=f"{where}.function.name")
    if not isinstance(description, str):
        raise ApiError(400, "'description' must be a string", param=f"{where}.function.description")
    if fn.get("strict") is True:
        raise ApiError(
            400,
            "'strict' is not supported: strict schemas need constrained decoding, which this server lacks",
            param=f"{where}.function.strict",
            code="unsupported_parameter",
        )
    parameters = fn.get("parameters") or _EMPTY_PARAMETERS
    try:
        return ToolSpec(name, description, parameters)
    except ConfigError as err:
        param = "name" if "tool name" in str(err) else "parameters"
        raise ApiError(400, str(err), param=f"{where}.function.{param}") from None


def _choice(value: Any, names: set[str]) -> tuple[str, str | None]:
    if value is None:
        return ("auto" if names else "none"), None
    if isinstance(value, str):
        if value not in ("none", "auto", "required"):
            raise ApiError(
                400, f"tool_choice {value!r} is not none, auto, required or a function", param="tool_choice"
            )
        if value != "none" and not names:
            raise ApiError(400, f"tool_choice '{value}' needs 'tools'", param="tool_choice")
        return value, None
    fn = value.get("function") if isinstance(value, dict) and value.get("type") == "function" else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str):
        raise ApiError(
            400,
            'tool_choice must be a string or {"type": "function", "function": {"name": ...}}',
            param="tool_choice",
        )
    if name not in names:
        raise ApiError(
            400,
            f"tool_choice names '{name}', which is not among the tools",
            param="tool_choice.function.name",
        )
    return "function", name


def uses_tools(tools: ChatTools, messages: list[dict[str, Any]]) -> bool:
    """Whether the prompt needs tool rendering: tools in use, or tool calls / results in the history."""
    return tools.active or any(m.get("tool_calls") or m["role"] == "tool" for m in messages)


def template_messages(
    tokenizer: Any, tools: ChatTools, messages: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """``(messages, tools)`` to hand the chat template: as they are, with the declarations, when the
    template renders tools itself (format hermes); else the format's text rendering and no tools."""
    shown = tools.specs if tools.active else ()
    if tools.fmt == "hermes" and template_takes_tools(tokenizer):
        return messages, ([t.to_openai() for t in shown] or None)
    return messages_as_text(messages, shown, tools.fmt), None
