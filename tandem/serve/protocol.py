"""OpenAI-shaped request bodies and the JSON error format.

Request models mirror the OpenAI completions and chat-completions APIs. Every documented OpenAI field is
either honoured or refused with a 400 that names it (``docs/serving.md`` has the table); fields OpenAI does
not define are ignored. Wrong types (booleans are strict: ``"stream": "yes"`` is a 400) and out-of-range
values are 400 errors that name the field in ``param``; ``null`` means the default. Every error body is
``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_LOGPROBS = 20  # top alternatives per token at most (vLLM's limit; OpenAI's legacy completions: 5)
GREEDY_BELOW = 1e-5  # temperatures below this decode greedily (as vLLM): logits / 1e-39 overflow to NaN


class ApiError(Exception):
    """An error answered as OpenAI-shaped JSON with an HTTP status (never a traceback)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict[str, Any]:
        """The JSON error body."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict:
    """``{"error": {...}}`` for errors raised outside :class:`ApiError`."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def unsupported(param: str, why: str) -> ApiError:
    """The 400 for an OpenAI field this server does not implement (never silently ignored)."""
    return ApiError(400, f"'{param}' is not supported: {why}", param=param, code="unsupported_parameter")


class StreamOptions(BaseModel):
    """``stream_options``: ``include_usage`` adds a final chunk with ``choices: []`` and the usage."""

    model_config = ConfigDict(extra="forbid")

    include_usage: StrictBool | None = Field(False, description="Send a final usage chunk.")
    include_obfuscation: StrictBool | None = Field(
        None, description="Accepted; this server never pads chunks, so there is nothing to switch off."
    )


# OpenAI fields this server refuses unless they carry their no-op value: field -> (no-op values, why).
_REFUSED: dict[str, tuple[tuple[Any, ...], str]] = {
    "suffix": ((None, ""), "a causal LM cannot insert text before a suffix"),
    "functions": ((None, []), "no function calling"),
    "function_call": ((None, "none"), "no function calling"),
    "audio": ((None,), "text only"),
    "modalities": ((None, ["text"]), "text only"),
    "prediction": ((None,), "no predicted outputs"),
    "reasoning_effort": ((None,), "not a reasoning model"),
    "web_search_options": ((None,), "no web search"),
    "store": ((None, False), "completions are not stored for distillation (see --feedback-db)"),
    "metadata": ((None, {}), "only used with store"),
    "service_tier": ((None, "auto", "default"), "one tier only"),
}


class GenerationRequest(BaseModel):
    """The sampling fields completions and chat requests share (OpenAI names and ranges)."""

    model_config = ConfigDict(extra="ignore", strict=False)

    model: str | None = Field(None, description="Served model id (see /v1/models); default: the served one.")
    max_tokens: StrictInt | None = Field(None, ge=1, description="Tokens to generate at most.")
    temperature: float = Field(
        1.0, ge=0.0, le=2.0, allow_inf_nan=False, description="Sampling temperature; 0 = greedy."
    )
    top_p: float = Field(1.0, gt=0.0, le=1.0, allow_inf_nan=False, description="Nucleus sampling mass.")
    top_k: StrictInt = Field(0, ge=-1, description="Top-k filter (0 or -1 disables); an extension.")
    min_p: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        allow_inf_nan=False,
        description="Min-p filter (0 disables); an extension, as vLLM's.",
    )
    repetition_penalty: float = Field(
        1.0,
        gt=0.0,
        le=10.0,
        allow_inf_nan=False,
        description="Divides the logit of a token already in the prompt or the answer (1 disables); an "
        "extension, as vLLM's.",
    )
    n: StrictInt = Field(1, ge=1, description="Completions per prompt.")
    stream: StrictBool = Field(False, description="Stream tokens as server-sent events.")
    stream_options: StreamOptions | None = Field(None, description="Only with stream: include_usage.")
    stop: str | list[str] | None = Field(None, description="Stop string(s), cut from the text.")
    seed: StrictInt | None = Field(
        None, ge=INT64_MIN, le=INT64_MAX, description="Seed for reproducible sampling (signed 64-bit)."
    )
    user: str | None = Field(None, description="End-user id; also picks the sticky A/B arm.")
    logit_bias: dict[str, float] | None = Field(
        None, description="Token id (as a string) -> bias in [-100, 100] added to its logit."
    )
    presence_penalty: float = Field(
        0.0, ge=-2.0, le=2.0, allow_inf_nan=False, description="Subtracted once from seen tokens' logits."
    )
    frequency_penalty: float = Field(
        0.0, ge=-2.0, le=2.0, allow_inf_nan=False, description="Subtracted per occurrence of a token."
    )

    @model_validator(mode="before")
    @classmethod
    def _nulls_are_defaults(cls, data: Any) -> Any:
        """``"field": null`` means the field's default, as in the OpenAI API."""
        return {k: v for k, v in data.items() if v is not None} if isinstance(data, dict) else data

    @field_validator("stop")
    @classmethod
    def _stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        items = [value] if isinstance(value, str) else (value or [])
        if len(items) > 4 or any(not s for s in items):
            raise ValueError("at most 4 non-empty stop strings")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        for key, bias in (value or {}).items():
            if not key.strip().lstrip("-").isdigit():
                raise ValueError(f"key '{key}' is not a token id")
            if not -100.0 <= bias <= 100.0:
                raise ValueError(f"bias {bias} of token {key} is outside [-100, 100]")
        return value

    def stop_list(self) -> list[str]:
        """``stop`` as a list."""
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def bias_ids(self) -> dict[int, float]:
        """``logit_bias`` with integer token ids (validated against the vocabulary by the route)."""
        return {int(k): float(v) for k, v in (self.logit_bias or {}).items()}

    def effective_temperature(self) -> float:
        """``temperature``, with anything below :data:`GREEDY_BELOW` decoded greedily (0)."""
        return 0.0 if self.temperature < GREEDY_BELOW else self.temperature

    def include_usage(self) -> bool:
        """Whether a streamed response ends with a usage chunk."""
        return bool(self.stream_options and self.stream_options.include_usage)

    def check(self) -> None:
        """Cross-field rules and refused OpenAI fields; ApiError(400) naming the field."""
        if self.stream_options is not None and not self.stream:
            raise ApiError(
                400, "'stream_options' is only allowed with 'stream': true", param="stream_options"
            )
        for name, no_ops, why in _refused_fields(type(self)):
            if getattr(self, name) not in no_ops:
                raise unsupported(name, why)


@cache
def _refused_fields(model: type[BaseModel]) -> list[tuple[str, tuple[Any, ...], str]]:
    """The :data:`_REFUSED` fields ``model`` has (looked up once per model: ``model_fields`` is a
    property that costs about as much as the check itself)."""
    return [(name, *rule) for name, rule in _REFUSED.items() if name in model.model_fields]


TokenIds = list[StrictInt]


class CompletionRequest(GenerationRequest):
    """Body of ``POST /v1/completions``."""

    prompt: str | list[str] | TokenIds | list[TokenIds] = Field(
        ..., description="Prompt text, a list of texts, token ids, or a list of token-id lists."
    )
    max_tokens: StrictInt | None = Field(16, ge=1, description="Tokens to generate at most.")
    echo: StrictBool = Field(False, description="Prefix each completion with its prompt.")
    logprobs: StrictInt | None = Field(
        None, ge=0, le=MAX_LOGPROBS, description="Log-probs of the sampled and this many likeliest tokens."
    )
    best_of: StrictInt | None = Field(
        None, ge=1, description="Sample this many per prompt, return the n of highest mean log-prob."
    )
    suffix: str | None = Field(None, description="Refused: a causal LM cannot insert before a suffix.")

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, value: Any) -> Any:
        if isinstance(value, list) and not value:
            raise ValueError("prompt list is empty")
        for i, item in enumerate(value if isinstance(value, list) else []):
            if isinstance(item, list) and not item:
                raise ValueError(f"prompt {i} is an empty token list")
        return value

    def prompts(self) -> list[str | list[int]]:
        """``prompt`` as a list of prompts, each a text or a token-id list."""
        if isinstance(self.prompt, str):
            return [self.prompt]
        if self.prompt and isinstance(self.prompt[0], int):
            return [list(self.prompt)]
        return list(self.prompt)

    def check(self) -> None:
        super().check()
        if self.best_of is not None and self.best_of < self.n:
            raise ApiError(400, f"best_of={self.best_of} must be >= n={self.n}", param="best_of")
        if self.stream and (self.best_of or self.n) > self.n:
            raise ApiError(400, "best_of > n cannot be streamed", param="best_of")


class FunctionCall(BaseModel):
    """``function`` of an assistant message's tool call: a name and the arguments as a JSON string."""

    model_config = ConfigDict(extra="ignore")

    name: str = Field(..., min_length=1)
    arguments: str

    @field_validator("arguments")
    @classmethod
    def _json_object(cls, value: str) -> str:
        try:
            parsed = json.loads(value) if value.strip() else {}
        except json.JSONDecodeError as err:
            raise ValueError(f"arguments are not valid JSON ({err.msg})") from None
        if not isinstance(parsed, dict):
            raise ValueError("arguments must encode a JSON object")
        return value


class ToolCallIn(BaseModel):
    """One tool call of an earlier assistant message (``messages[i].tool_calls[j]``)."""

    model_config = ConfigDict(extra="ignore")

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    """One chat message: text content, or a list of text parts (joined with newlines). An assistant
    message may carry ``tool_calls`` (then ``content`` may be null); a ``tool`` message answers one by
    ``tool_call_id``."""

    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None

    @model_validator(mode="after")
    def _roles(self) -> ChatMessage:
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs the 'tool_call_id' it answers")
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError("content is required (null only for an assistant message with tool_calls)")
        return self

    @field_validator("content")
    @classmethod
    def _parts(cls, value: str | list[dict[str, Any]]) -> str | list[dict[str, Any]]:
        for i, part in enumerate(value if isinstance(value, list) else []):
            kind = part.get("type")
            if kind != "text":
                raise ValueError(f"content part {i} has type '{kind}'; only 'text' parts are supported")
            if not isinstance(part.get("text"), str):
                raise ValueError(f"content part {i} needs a string 'text'")
        return value

    def text(self) -> str:
        """The message text (text parts joined with newlines, as vLLM does)."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "\n".join(part["text"] for part in self.content)

    def for_template(self) -> dict[str, Any]:
        """The message as chat templates expect it (tool-call arguments as objects, as Hugging Face
        templates read them)."""
        out: dict[str, Any] = {"role": self.role, "content": self.text()}
        if self.tool_calls:
            out["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.function.name,
                 "arguments": json.loads(c.function.arguments or "{}")}}
                for c in self.tool_calls
            ]  # fmt: skip
        if self.tool_call_id:
            out["tool_call_id"] = self.tool_call_id
        return out | ({"name": self.name} if self.name else {})

    def for_record(self) -> dict[str, Any]:
        """The message in OpenAI's shape (for recorded conversations)."""
        return self.model_dump(exclude_none=True)


class ChatRequest(GenerationRequest):
    """Body of ``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(..., min_length=1, description="The conversation so far.")
    max_completion_tokens: StrictInt | None = Field(None, ge=1, description="Newer name of max_tokens.")
    logprobs: StrictBool = Field(False, description="Return the log-prob of each generated token.")
    top_logprobs: StrictInt | None = Field(
        None, ge=0, le=MAX_LOGPROBS, description="With logprobs: this many likeliest tokens per position."
    )
    response_format: dict[str, Any] | None = Field(
        None,
        description="{'type': 'text'} only; json_object / json_schema are refused (no constrained decoding).",
    )
    parallel_tool_calls: StrictBool | None = Field(
        None, description="False: at most one tool call per answer (the first the model wrote)."
    )
    tools: list[Any] | None = Field(
        None,
        description="Function tools (JSON-schema parameters) the model may call; see tandem.serve.tools.",
    )
    tool_choice: Any = Field(
        None, description="'none', 'auto' (default with tools), 'required' or a function."
    )
    functions: list[Any] | None = Field(None, description="Refused: no function calling.")
    function_call: Any = Field(None, description="Refused unless 'none'.")
    audio: Any = Field(None, description="Refused: text only.")
    modalities: list[str] | None = Field(None, description="Only ['text'].")
    prediction: Any = Field(None, description="Refused: no predicted outputs.")
    reasoning_effort: Any = Field(None, description="Refused: not a reasoning model.")
    web_search_options: Any = Field(None, description="Refused: no web search.")
    store: StrictBool | None = Field(None, description="Only false: use --feedback-db to keep answers.")
    metadata: dict[str, Any] | None = Field(None, description="Only with store; refused.")
    service_tier: str | None = Field(None, description="'auto' or 'default' only.")

    def check(self) -> None:
        super().check()
        if self.top_logprobs is not None and not self.logprobs:
            raise ApiError(400, "'top_logprobs' needs 'logprobs': true", param="top_logprobs")
        _check_response_format(self.response_format)

    def token_limit(self) -> int | None:
        """``max_completion_tokens`` (newer name) or ``max_tokens``; None: the rest of the context."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


def _check_response_format(value: dict[str, Any] | None) -> None:
    """``{"type": "text"}`` passes; a malformed format is a 400 naming its field; json_object and
    json_schema are a 400 saying they are unsupported (this server has no constrained decoding)."""
    if value is None:
        return
    kind = value.get("type")
    if kind == "text":
        return
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise ApiError(
                400, "response_format json_schema needs a 'json_schema.schema' object",
                param="response_format.json_schema.schema",
            )  # fmt: skip
    elif kind != "json_object":
        raise ApiError(
            400, f"response_format type {kind!r} is not one of text, json_object, json_schema",
            param="response_format.type",
        )  # fmt: skip
    raise unsupported("response_format", f"type '{kind}' needs constrained decoding, which this server lacks")


class PredictRequest(BaseModel):
    """Body of ``POST /predict``: the simplest possible client. As strict as the OpenAI bodies (a
    ``"3"`` or ``3.0`` for ``max_tokens`` is a 400 naming it, not silently converted), so one client
    sees the same rules on every route."""

    model_config = ConfigDict(extra="ignore")

    text: StrictStr = Field(..., description="Prompt text.")
    max_tokens: StrictInt = Field(32, ge=1, description="Tokens to generate at most.")


def validation_param(loc: tuple[Any, ...]) -> str | None:
    """The dotted field name of a pydantic error location (``("body", "messages", 0, "role")``)."""
    types = {"str", "int", "float", "bool", "list", "dict", "none"}
    parts = [str(p) for p in loc if p != "body" and not (isinstance(p, str) and (p in types or "[" in p))]
    return ".".join(parts) if parts else None
