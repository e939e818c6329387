"""Tools an agent can call: declarations, parsing calls out of model text, executing them, rendering.

A tool is a :class:`ToolSpec`: a name, a description, a JSON-schema ``parameters`` object (OpenAI's
function declaration) and a callable, sync or async, that takes the arguments as keywords and returns a
string (or a :class:`ToolOutput` when it wants to flag an error or a sandbox kill).

The model writes calls in a *format*, chosen by name from :data:`TOOL_CALL_FORMATS`:

- ``hermes`` — what Qwen2/2.5/3 and Hermes chat templates teach: one JSON object per call between tags,
  several per turn allowed::

      <tool_call>
      {"name": "calc", "arguments": {"expression": "12*34"}}
      </tool_call>

  A last call left open (generation stopped at ``</tool_call>`` as a stop string, or at the end of
  the sequence) counts when its JSON is complete. Tool results come back as
  ``<tool_response>\\n...\\n</tool_response>``.
- ``plain`` — compact enough for a tiny character-level model to learn: ``CALL name(argument)``.
  A tool with exactly one parameter takes the raw text between the parentheses as that parameter
  (``CALL calc(12*34)``, ``CALL python(print(2**10))``; a number parameter is parsed as a JSON number); a
  tool with no parameters is called as ``CALL name()``; a tool with several parameters takes a JSON
  object (``CALL add({"a": 1, "b": 2})``). The argument ends at the parenthesis that balances the
  opening one, parentheses inside ``'...'``/``"..."`` string literals not counted, so code with calls in
  it passes whole. Results come back as ``RESULT <text>``, errors as ``ERROR <message>``.

Parsing never raises: a malformed call (bad JSON, an unknown tool, arguments that break the schema, an
unterminated call) is a :class:`ToolCall` with ``error`` set, whose message becomes the observation the
model reads next turn and counts towards the tool error rate. Executing never raises either: a tool
that raises, times out or returns a non-string gives an error :class:`ToolResult`.

Prompts: :func:`render_prompt` puts the tools into the prompt. A chat template that reads ``tools``
(Qwen's do) renders them itself through ``apply_chat_template(tools=...)``; otherwise the format's
:meth:`~ToolCallFormat.instructions` become (or join) the system message, assistant ``tool_calls`` are
written back as the format's call text and ``tool`` messages as its result text, so the prompt shows the
model exactly the syntax it must produce.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tandem.agents.schema import check_schema, validate
from tandem.algos.registry import Registry, UnknownNameError
from tandem.errors import ConfigError, first_line

_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")


@dataclass(frozen=True)
class ToolOutput:
    """What a tool may return instead of a plain string: text plus an error flag and, for sandboxed
    tools, why the process was killed (``"cpu_time"``, ``"wall_time"``, ``"memory"``, ``"output"``...)."""

    content: str
    error: bool = False
    kill_reason: str | None = None


ToolFn = Callable[..., "str | ToolOutput | Awaitable[str | ToolOutput]"]


@dataclass(frozen=True)
class ToolSpec:
    """A tool: ``parameters`` is a JSON-schema object (``{"type": "object", "properties": {...},
    "required": [...]}``); ``fn(**arguments)`` runs it. ``fn`` None declares a tool that someone else
    runs (a served model's client): its calls are parsed and validated, and executing one here is an
    error result. ConfigError at construction for a bad name or schema."""

    name: str
    description: str
    parameters: Mapping[str, Any]
    fn: ToolFn | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME_RE.match(self.name):
            raise ConfigError(f"tool name {self.name!r} must match {_NAME_RE.pattern}")
        err = check_schema(self.parameters, where=f"tool '{self.name}' parameters")
        if err:
            raise ConfigError(err)
        if self.fn is not None and not callable(self.fn):
            raise ConfigError(f"tool '{self.name}': fn is not callable")

    def properties(self) -> dict[str, Any]:
        """The declared parameters (name -> schema), in declaration order."""
        return dict(self.parameters.get("properties") or {})

    def validate(self, arguments: Any) -> str | None:
        """One error line when ``arguments`` break the schema, else None."""
        if not isinstance(arguments, dict):
            return f"tool '{self.name}': arguments must be a JSON object"
        err = validate(arguments, self.parameters)
        return f"tool '{self.name}': {err}" if err else None

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI / chat-template declaration ``{"type": "function", "function": {...}}``."""
        fn = {"name": self.name, "description": self.description, "parameters": dict(self.parameters)}
        return {"type": "function", "function": fn}


def tool_map(tools: Sequence[ToolSpec] | Mapping[str, ToolSpec]) -> dict[str, ToolSpec]:
    """Tools by name; ConfigError for a name declared twice."""
    if isinstance(tools, Mapping):
        return dict(tools)
    out: dict[str, ToolSpec] = {}
    for tool in tools:
        if tool.name in out:
            raise ConfigError(f"tool '{tool.name}' is declared twice")
        out[tool.name] = tool
    return out


@dataclass(frozen=True)
class ToolCall:
    """One call found in model text. ``error`` is set (and the call is not executed) when it is
    malformed; ``raw`` is the call's text span as the model wrote it."""

    id: str
    name: str
    arguments: dict[str, Any]
    raw: str
    error: str | None = None


@dataclass(frozen=True)
class ParseResult:
    """Model text split into prose (``content``, the text outside calls, stripped) and calls in order."""

    content: str
    calls: tuple[ToolCall, ...] = ()

    @property
    def valid_calls(self) -> tuple[ToolCall, ...]:
        return tuple(c for c in self.calls if c.error is None)

    @property
    def errors(self) -> tuple[str, ...]:
        return tuple(c.error for c in self.calls if c.error is not None)

    @property
    def error(self) -> bool:
        """True when any call was malformed."""
        return any(c.error is not None for c in self.calls)

    @property
    def error_message(self) -> str:
        """Every malformed call's message, one per line ('' when none)."""
        return "\n".join(self.errors)


@dataclass(frozen=True)
class ToolResult:
    """The outcome of one call: the text the model reads, whether it is an error, the wall seconds it
    took, and the sandbox kill reason if the tool reports one."""

    call_id: str
    name: str
    content: str
    error: bool = False
    seconds: float = 0.0
    kill_reason: str | None = None

    def message(self) -> dict[str, Any]:
        """The OpenAI ``tool`` message carrying this result."""
        return {"role": "tool", "tool_call_id": self.call_id, "name": self.name, "content": self.content}


class ToolCallFormat(Protocol):
    """How calls are written in model text and how results are shown back."""

    name: str
    call_end: str | None  # a stop string that closes a call (None: the format has none)

    def parse(self, text: str, tools: Mapping[str, ToolSpec]) -> ParseResult: ...
    def render_call(self, name: str, arguments: Mapping[str, Any], tools: Mapping[str, ToolSpec]) -> str: ...
    def render_result(self, result: ToolResult) -> str: ...
    def instructions(self, tools: Sequence[ToolSpec]) -> str: ...


def _check_call(index: int, name: Any, arguments: Any, raw: str, tools: Mapping[str, ToolSpec]) -> ToolCall:
    """A ToolCall for ``name(arguments)``, with ``error`` set for an unknown tool or bad arguments."""
    call_id = f"call_{index}"
    if not isinstance(name, str) or name not in tools:
        known = ", ".join(tools) or "none"
        return ToolCall(call_id, str(name), {}, raw, f"unknown tool {name!r} (tools: {known})")
    err = tools[name].validate(arguments)
    if err:
        return ToolCall(call_id, name, arguments if isinstance(arguments, dict) else {}, raw, err)
    return ToolCall(call_id, name, arguments, raw)


class HermesFormat:
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Qwen / Hermes chat templates)."""

    name = "hermes"
    call_end: str | None = "</tool_call>"
    _OPEN, _CLOSE = "<tool_call>", "</tool_call>"

    def parse(self, text: str, tools: Mapping[str, ToolSpec]) -> ParseResult:
        calls: list[ToolCall] = []
        prose: list[str] = []
        pos = 0
        while (start := text.find(self._OPEN, pos)) >= 0:
            prose.append(text[pos:start])
            end = text.find(self._CLOSE, start)
            if end < 0:  # generation stopped at "</tool_call>" (a stop string, cut) or at EOS
                call = self._one(len(calls), text[start + len(self._OPEN) :], text[start:], tools)
                if call.error is not None and call.name == "":
                    call = ToolCall(call.id, "", {}, call.raw, f"unterminated <tool_call>: {call.error}")
                calls.append(call)
                pos = len(text)
                break
            raw = text[start : end + len(self._CLOSE)]
            calls.append(self._one(len(calls), text[start + len(self._OPEN) : end], raw, tools))
            pos = end + len(self._CLOSE)
        prose.append(text[pos:])
        return ParseResult("".join(prose).strip(), tuple(calls))

    def _one(self, index: int, body: str, raw: str, tools: Mapping[str, ToolSpec]) -> ToolCall:
        obj, why = _json(body)
        if why is not None:
            return ToolCall(f"call_{index}", "", {}, raw, f"tool call is not valid JSON: {why}")
        if not isinstance(obj, dict) or "name" not in obj:
            return ToolCall(
                f"call_{index}", "", {}, raw, 'tool call must be {"name": ..., "arguments": {...}}'
            )
        arguments = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(arguments, str):  # some models emit the arguments as a JSON string
            arguments, why = _json(arguments) if arguments.strip() else ({}, None)
            if why is not None:
                msg = f"tool call arguments are not valid JSON: {why}"
                return ToolCall(f"call_{index}", str(obj["name"]), {}, raw, msg)
        return _check_call(index, obj["name"], arguments, raw, tools)

    def render_call(self, name: str, arguments: Mapping[str, Any], tools: Mapping[str, ToolSpec]) -> str:
        body = json.dumps({"name": name, "arguments": dict(arguments)}, ensure_ascii=False)
        return f"{self._OPEN}\n{body}\n{self._CLOSE}"

    def render_result(self, result: ToolResult) -> str:
        return f"<tool_response>\n{result.content}\n</tool_response>"

    def instructions(self, tools: Sequence[ToolSpec]) -> str:
        decls = "\n".join(json.dumps(t.to_openai(), ensure_ascii=False) for t in tools)
        return (
            "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n"
            f"<tools>\n{decls}\n</tools>\n\n"
            "For each function call, return a json object with function name and arguments within "
            "<tool_call></tool_call> XML tags:\n"
            '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
        )


def _balanced_end(text: str, start: int) -> int:
    """Index of the ``)`` closing the ``(`` just before ``start``, skipping quoted strings; -1 if none."""
    depth, i, quote = 1, start, ""
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return -1


class PlainFormat:
    """``CALL name(argument)``: see the module docstring for how arguments map to parameters."""

    name = "plain"
    call_end: str | None = None
    _CALL = re.compile(r"(?<![A-Za-z0-9_])CALL ([A-Za-z_][A-Za-z0-9_.-]*)\(")

    def parse(self, text: str, tools: Mapping[str, ToolSpec]) -> ParseResult:
        calls: list[ToolCall] = []
        prose: list[str] = []
        pos = 0
        while m := self._CALL.search(text, pos):
            prose.append(text[pos : m.start()])
            end = _balanced_end(text, m.end())
            if end < 0:
                calls.append(
                    ToolCall(
                        f"call_{len(calls)}",
                        m.group(1),
                        {},
                        text[m.start() :],
                        "unterminated CALL (no closing ')')",
                    )
                )
                pos = len(text)
                break
            raw = text[m.start() : end + 1]
            calls.append(self._one(len(calls), m.group(1), text[m.end() : end], raw, tools))
            pos = end + 1
        prose.append(text[pos:])
        return ParseResult("".join(prose).strip(), tuple(calls))

    def _one(self, index: int, name: str, arg: str, raw: str, tools: Mapping[str, ToolSpec]) -> ToolCall:
        if name not in tools:
            return _check_call(index, name, {}, raw, tools)
        props = tools[name].properties()
        if not props:
            arguments: Any = {}
            if arg.strip():
                return ToolCall(f"call_{index}", name, {}, raw, f"tool '{name}' takes no arguments")
        elif len(props) == 1:
            ((key, schema),) = props.items()
            arguments = {key: _coerce(arg, schema)}
        else:
            arguments, why = _json(arg)
            if why is not None:
                msg = f"tool '{name}' takes a JSON object of arguments ({', '.join(props)}): {why}"
                return ToolCall(f"call_{index}", name, {}, raw, msg)
        return _check_call(index, name, arguments, raw, tools)

    def render_call(self, name: str, arguments: Mapping[str, Any], tools: Mapping[str, ToolSpec]) -> str:
        props = tools[name].properties() if name in tools else {}
        if len(props) == 1 and set(arguments) <= set(props):
            value = next(iter(arguments.values()), "")
            return f"CALL {name}({value if isinstance(value, str) else json.dumps(value)})"
        body = json.dumps(dict(arguments), ensure_ascii=False) if arguments else ""
        return f"CALL {name}({body})"

    def render_result(self, result: ToolResult) -> str:
        return f"{'ERROR' if result.error else 'RESULT'} {result.content}"

    def instructions(self, tools: Sequence[ToolSpec]) -> str:
        lines = ["Tools:"]
        for t in tools:
            params = ", ".join(f"{k}: {v.get('type', 'any')}" for k, v in t.properties().items())
            lines.append(f"{t.name}({params}) - {t.description}")
        lines.append("Call a tool by writing CALL name(argument); its result comes back as RESULT <text>.")
        return "\n".join(lines)


def _coerce(text: str, schema: Mapping[str, Any]) -> Any:
    """The plain format's single argument as its declared type: strings stay raw text, other types are
    parsed as JSON (an unparsable value stays a string, so validation reports the type mismatch)."""
    types = schema.get("type")
    if types == "string" or (isinstance(types, list) and "string" in types) or types is None:
        return text
    value, why = _json(text)
    return text if why is not None else value


def _json(text: str) -> tuple[Any, str | None]:
    """``text`` parsed as JSON, or None and why it is not (one line). Model text is anything: besides
    malformed JSON, nesting too deep for the parser (``[[[[...``, a RecursionError) and integers too
    long to convert (a ValueError) are answers like any other, not crashes."""
    try:
        return json.loads(text), None
    except json.JSONDecodeError as err:
        return None, f"{err.msg} at char {err.pos}"
    except RecursionError:
        return None, "nested too deeply"
    except ValueError as err:  # e.g. "Exceeds the limit (4300 digits) for integer string conversion"
        return None, first_line(err)


TOOL_CALL_FORMATS: Registry[ToolCallFormat] = Registry("tool call format")
TOOL_CALL_FORMATS.add(HermesFormat.name, HermesFormat())
TOOL_CALL_FORMATS.add(PlainFormat.name, PlainFormat())


def get_format(name: str, *, key: str | None = None) -> ToolCallFormat:
    """The tool-call format ``name``; ConfigError (at config ``key``) listing the valid ones."""
    try:
        return TOOL_CALL_FORMATS.get(name)
    except UnknownNameError as err:
        raise ConfigError(str(err), where=key) from None


def parse_tool_calls(
    text: str, tools: Sequence[ToolSpec] | Mapping[str, ToolSpec], fmt: str = "hermes"
) -> ParseResult:
    """Calls in ``text`` written in format ``fmt`` (never raises for malformed calls)."""
    return get_format(fmt).parse(text, tool_map(tools))


# --- execution ---------------------------------------------------------------------------------------


async def call_tool(
    call: ToolCall,
    tools: Mapping[str, ToolSpec],
    *,
    timeout_s: float | None = None,
    max_chars: int | None = 4096,
) -> ToolResult:
    """Run one call; never raises. A malformed call returns its parse error; a sync tool runs in a
    worker thread (so calls of many episodes overlap); a tool that raises, returns a non-string or runs
    past ``timeout_s`` gives an error result (a timed-out sync tool's thread cannot be killed and runs
    on: long or untrusted work belongs in the sandbox, which has its own limits). Content longer than
    ``max_chars`` is truncated with a marker."""
    if call.error is not None:
        return ToolResult(call.id, call.name, call.error, error=True)
    fn = tools[call.name].fn
    if fn is None:
        return ToolResult(
            call.id, call.name, f"tool '{call.name}' is declared but not runnable here", error=True
        )
    start = time.perf_counter()
    try:
        out = await asyncio.wait_for(_invoke(fn, call.arguments), timeout_s)
    except TimeoutError:
        msg = f"tool '{call.name}' timed out after {timeout_s:g}s"
        return ToolResult(call.id, call.name, msg, True, time.perf_counter() - start, "wall_time")
    except Exception as err:  # a user tool's failure is the model's observation, not a crash
        msg = f"tool '{call.name}' failed: {type(err).__name__}: {first_line(err)}"
        return ToolResult(call.id, call.name, msg, True, time.perf_counter() - start)
    seconds = time.perf_counter() - start
    if isinstance(out, ToolOutput):
        content, error, kill = out.content, out.error, out.kill_reason
    elif isinstance(out, str):
        content, error, kill = out, False, None
    else:
        msg = f"tool '{call.name}' returned {type(out).__name__}, not a string"
        return ToolResult(call.id, call.name, msg, True, seconds)
    return ToolResult(call.id, call.name, truncate(content, max_chars), error, seconds, kill)


async def _invoke(fn: ToolFn, arguments: dict[str, Any]) -> Any:
    if inspect.iscoroutinefunction(fn):
        return await fn(**arguments)
    out = await asyncio.to_thread(fn, **arguments)
    return await out if inspect.isawaitable(out) else out


async def run_tool_calls(
    parsed: ParseResult,
    tools: Sequence[ToolSpec] | Mapping[str, ToolSpec],
    *,
    timeout_s: float | None = None,
    max_chars: int | None = 4096,
) -> list[ToolResult]:
    """Results of every call in ``parsed`` (malformed ones included, as errors), in call order; the
    calls run concurrently."""
    table = tool_map(tools)
    jobs = [call_tool(c, table, timeout_s=timeout_s, max_chars=max_chars) for c in parsed.calls]
    return list(await asyncio.gather(*jobs))


def truncate(text: str, max_chars: int | None) -> str:
    """``text`` cut to ``max_chars`` characters with a ``...[truncated N chars]`` marker."""
    if max_chars is None or len(text) <= max_chars:
        return text
    return f"{text[:max_chars]}...[truncated {len(text) - max_chars} chars]"


def observation(results: Sequence[ToolResult], fmt: str = "hermes") -> str:
    """The text the model reads after its calls: every result in the format's result syntax, one per
    line."""
    f = get_format(fmt)
    return "\n".join(f.render_result(r) for r in results)


# --- prompts -----------------------------------------------------------------------------------------


def template_takes_tools(tokenizer: Any) -> bool:
    """True when ``tokenizer``'s chat template reads a ``tools`` variable (Qwen's, Hermes', Llama 3.1's):
    it renders declarations and tool messages itself. A template that never mentions ``tools`` would
    silently drop them."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # named templates: the default one, or a dedicated tool_use one
        template = template.get("tool_use") or template.get("default")
    return isinstance(template, str) and re.search(r"\btools\b", template) is not None


def messages_as_text(
    messages: Sequence[Mapping[str, Any]], tools: Sequence[ToolSpec], fmt: str = "hermes"
) -> list[dict[str, str]]:
    """``messages`` for a template (or plain text) that knows nothing of tools: the format's
    instructions become the system message (joined to an existing one), assistant ``tool_calls`` are
    appended to the content as call text and ``tool`` messages carry the result text. Every content is
    a string."""
    f, table = get_format(fmt), tool_map(tools)
    out: list[dict[str, str]] = []
    if tools:
        out.append({"role": "system", "content": f.instructions(tools)})
    for m in messages:
        role, content = str(m.get("role", "")), m.get("content") or ""
        if not isinstance(content, str):  # OpenAI content parts: keep the text ones
            content = "".join(p.get("text", "") for p in content if isinstance(p, Mapping))
        if role == "system" and out and out[0]["role"] == "system" and len(out) == 1:
            out[0]["content"] = f"{content}\n\n{out[0]['content']}"
            continue
        if role == "assistant" and m.get("tool_calls"):
            calls = [_call_text(c, f, table) for c in m["tool_calls"]]
            content = "\n".join([content, *calls] if content else calls)
        elif role == "tool":
            content = f.render_result(
                ToolResult(str(m.get("tool_call_id", "")), str(m.get("name", "")), content)
            )
        out.append({"role": role, "content": content})
    return out


def _call_text(call: Mapping[str, Any], f: ToolCallFormat, table: Mapping[str, ToolSpec]) -> str:
    fn = call.get("function", call)
    arguments = fn.get("arguments", {})
    if isinstance(arguments, str):
        arguments, why = _json(arguments) if arguments.strip() else ({}, None)
        if why is not None:
            arguments = {}
    return f.render_call(str(fn.get("name", "")), arguments if isinstance(arguments, dict) else {}, table)


def render_prompt(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[ToolSpec],
    fmt: str = "hermes",
    *,
    add_generation_prompt: bool = True,
) -> str:
    """The generation text for ``messages`` with ``tools`` available. A template that reads ``tools``
    gets them through ``apply_chat_template(tools=...)`` (format ``hermes`` only: such templates teach
    their own syntax); otherwise :func:`messages_as_text` is rendered through the template, or, with no
    template (a char-level model), joined one message per line."""
    if fmt == "hermes" and template_takes_tools(tokenizer):
        decls = [t.to_openai() for t in tools] or None
        return tokenizer.apply_chat_template(
            [dict(m) for m in messages],
            tools=decls,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
        )
    plain = messages_as_text(messages, tools, fmt)
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            plain, tokenize=False, add_generation_prompt=add_generation_prompt
        )
    return "".join(m["content"] + "\n" for m in plain)
