"""What the routes share: settings, server state, key checks, JSON body parsing, error handlers.

Only this package imports fastapi. Bad input never reaches generation: bodies are validated into the
models of :mod:`tandem.serve.protocol` and every failure is answered with OpenAI's JSON error shape and
the status listed in ``docs/serving.md`` (400 invalid, 401 key, 404 model, 408 slow body, 413 body
size, 429 queue full, 503 not ready). The app itself is assembled by
:func:`tandem.serve.server.make_app`; the key is checked before the body is read
(:mod:`tandem.serve.middleware`).
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from tandem.errors import ConfigError
from tandem.serve.batcher import RowFailedError
from tandem.serve.metrics import Metrics
from tandem.serve.middleware import key_from_headers, key_matches
from tandem.serve.protocol import ApiError, error_body, validation_param
from tandem.serve.router import Router

logger = logging.getLogger(__name__)


@dataclass
class ServeSettings:
    """Limits and keys of one server (``tandem serve`` flags)."""

    max_batch_size: int = 32
    max_wait_ms: float = 10.0
    max_queue: int = 256
    cache_size: int = 1024
    max_tokens_limit: int = 512
    max_n: int = 8
    max_prompts: int = 32
    max_body_bytes: int = 1 << 20
    api_keys: list[str] = field(default_factory=list)
    admin_key: str | None = None
    feedback_db: str | None = None
    read_timeout_s: float = 30.0  # a request's head, and then its body, must arrive within this
    keep_alive_s: int = 5  # an idle keep-alive connection is closed after this
    max_connections: int = 1024  # open connections (or running requests) beyond which requests get 503
    state_dir: str | None = None  # replicas: folder of the shared admin state (set by run_replicas)

    def __post_init__(self) -> None:
        for key in self.api_keys:
            check_key(key, "--api-key")
        if self.admin_key is not None:
            check_key(self.admin_key, "--admin-key")
        if not self.read_timeout_s > 0:
            raise ConfigError(f"must be > 0, got {self.read_timeout_s}", where="--read-timeout")
        if self.max_connections < 1:
            raise ConfigError(f"must be >= 1, got {self.max_connections}", where="--max-connections")


def check_key(key: str, where: str) -> None:
    """ConfigError for a key that can never be presented safely: empty, or containing whitespace
    (HTTP strips header values, so a key of spaces would be matched by an empty header)."""
    if not key or any(c.isspace() for c in key):
        raise ConfigError(
            "an API key must be non-empty and contain no whitespace",
            where=where,
            hint="e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))'",
        )


class ServerState:
    """Everything the routes share: settings, router (arms), metrics, readiness, feedback store, and the
    admin state this replica serves: ``store`` (:mod:`tandem.serve.admin_state`), ``applied`` (the
    version the router shows) and ``loaded`` (load id -> arm loaded in this process)."""

    def __init__(self, settings: ServeSettings, name: str) -> None:
        self.settings = settings
        self.name = name
        self.router = Router()
        self.metrics = Metrics()
        self.ready = False
        self.batchers: list = []  # every batcher ever started (replaced arms stay alive for rollback)
        self.feedback = None
        self.started = time.time()
        self.store = None  # MemoryStore or FileStore
        self.applied = -1
        self.loaded: dict = {}
        self.loading: set[str] = set()  # load ids being loaded in the background
        self.failed: dict[str, str] = {}  # load id -> why this replica could not load it


_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")


def parse_json_object(raw: bytes) -> dict:
    """The JSON object of a request body; 400 (never 500) for invalid JSON, nesting too deep for the
    parser, a lone UTF-16 surrogate escape (``"\\ud800"``: not text, and it breaks tokenizers and
    SQLite), or a value that is not an object."""
    try:
        data = json.loads(raw or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ApiError(400, f"body is not valid JSON: {err}", code="json_invalid") from err
    except RecursionError as err:
        raise ApiError(400, "body is nested too deeply", code="json_too_deep") from err
    if not isinstance(data, dict):
        raise ApiError(400, "body must be a JSON object", code="invalid_body")
    if _SURROGATE.search(raw):
        try:
            json.dumps(data, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as err:
            raise ApiError(
                400,
                "body contains a lone UTF-16 surrogate escape (not valid Unicode text)",
                code="invalid_unicode",
            ) from err
    return data


def check_user_key(state: ServerState, request: Request) -> None:
    """401 unless the request carries one of the API keys (no keys configured: open, loopback only)."""
    keys = state.settings.api_keys
    if keys and not key_matches(key_from_headers(request.headers.raw), keys):
        raise ApiError(
            401,
            "missing or invalid API key (send 'Authorization: Bearer <key>')",
            type="authentication_error",
            code="invalid_api_key",
        )


def check_admin_key(state: ServerState, request: Request) -> None:
    """401 unless the request carries the admin key; the admin API is off without one."""
    admin = state.settings.admin_key
    if not admin:
        raise ApiError(404, "admin API disabled (start the server with an admin key)", code="admin_disabled")
    if not key_matches(key_from_headers(request.headers.raw), [admin]):
        raise ApiError(
            401, "missing or invalid admin key", type="authentication_error", code="invalid_admin_key"
        )


def install_error_handlers(app: FastAPI) -> None:
    """Every error as ``{"error": {...}}``: validation 400, HTTP errors their status, bugs 500."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        param = validation_param(tuple(first.get("loc", ())))
        kind = first.get("type", "")
        message = "body is not valid JSON" if kind == "json_invalid" else f"{param or 'body'}: {first['msg']}"
        return JSONResponse(
            error_body(message, "invalid_request_error", param, kind or None), status_code=400
        )

    @app.exception_handler(RowFailedError)
    async def _row_failed(request: Request, exc: RowFailedError) -> JSONResponse:
        return JSONResponse(error_body(str(exc), "server_error", None, "generation_failed"), status_code=500)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return JSONResponse(
            error_body(str(exc.detail), "invalid_request_error", None, code), status_code=exc.status_code
        )

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error on %s", request.url.path)
        return JSONResponse(
            error_body("internal server error", "server_error", None, "internal_error"), status_code=500
        )


def metrics_text(state: ServerState) -> PlainTextResponse:
    """The /metrics response (Prometheus text format 0.0.4)."""
    for arm in state.router.arms.values():
        state.metrics.set("queue_depth", arm.batcher.depth, "Rows waiting to be batched.", arm=arm.name)
        state.metrics.set("cache_entries", len(arm.cache), "Cached greedy responses.", arm=arm.name)
    return PlainTextResponse(state.metrics.render(), media_type="text/plain; version=0.0.4")
