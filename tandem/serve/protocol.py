"""OpenAI-shaped request bodies and the JSON error format.

Request models mirror the OpenAI completions and chat-completions APIs (the fields a causal LM can honour);
unknown fields are ignored as OpenAI does, wrong types and out-of-range values are 400 errors that name the
field in ``param``. Every error body is ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


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


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=False)

    model: str | None = Field(None, description="Served model id (see /v1/models); default: the served one.")
    max_tokens: int | None = Field(None, ge=1, description="Tokens to generate at most.")
    temperature: float = Field(1.0, ge=0.0, le=2.0, description="Sampling temperature; 0 = greedy.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    top_k: int = Field(0, ge=0, description="Top-k filter (0 disables); an extension of the OpenAI API.")
    n: int = Field(1, ge=1, description="Completions per prompt.")
    stream: bool = Field(False, description="Stream tokens as server-sent events.")
    stop: str | list[str] | None = Field(None, description="Stop string(s), cut from the text.")
    seed: int | None = Field(None, description="Seed for reproducible sampling.")
    user: str | None = Field(None, description="End-user id; also picks the sticky A/B arm.")

    @field_validator("stop")
    @classmethod
    def _stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        items = [value] if isinstance(value, str) else (value or [])
        if len(items) > 4 or any(not s for s in items):
            raise ValueError("at most 4 non-empty stop strings")
        return value

    def stop_list(self) -> list[str]:
        """``stop`` as a list."""
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class CompletionRequest(_Request):
    """Body of ``POST /v1/completions``."""

    prompt: str | list[str] = Field(..., description="Prompt text, or a list of prompts.")
    max_tokens: int | None = Field(16, ge=1, description="Tokens to generate at most.")

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, value: str | list[str]) -> str | list[str]:
        if isinstance(value, list) and not value:
            raise ValueError("prompt list is empty")
        return value

    def prompts(self) -> list[str]:
        """``prompt`` as a list."""
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)


class ChatMessage(BaseModel):
    """One chat message."""

    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str


class ChatRequest(_Request):
    """Body of ``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(..., min_length=1, description="The conversation so far.")
    max_completion_tokens: int | None = Field(None, ge=1, description="Alias of max_tokens (newer API).")


class PredictRequest(BaseModel):
    """Body of ``POST /predict``: the simplest possible client."""

    model_config = ConfigDict(extra="ignore")

    text: str = Field(..., description="Prompt text.")
    max_tokens: int = Field(32, ge=1, description="Tokens to generate at most.")


def validation_param(loc: tuple[Any, ...]) -> str | None:
    """The dotted field name of a pydantic error location (``("body", "messages", 0, "role")``)."""
    types = {"str", "int", "float", "bool", "list", "dict", "none"}
    parts = [str(p) for p in loc if p != "body" and not (isinstance(p, str) and (p in types or "[" in p))]
    return ".".join(parts) if parts else None
