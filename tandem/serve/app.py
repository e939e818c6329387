"""The FastAPI application: OpenAI-compatible endpoints, health, metrics, /predict and the admin API.

Only this package imports fastapi. Bad input never reaches generation: bodies are validated into the
models of :mod:`tandem.serve.protocol` and every failure is answered with OpenAI's JSON error shape and
the status listed in ``docs/serving.md`` (400 invalid, 401 key, 404 model, 413 body size, 429 queue full,
503 not ready).
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from tandem.serve.metrics import Metrics
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


class ServerState:
    """Everything the routes share: settings, router (arms), metrics, readiness, feedback store."""

    def __init__(self, settings: ServeSettings, name: str) -> None:
        self.settings = settings
        self.name = name
        self.router = Router()
        self.metrics = Metrics()
        self.ready = False
        self.batchers: list = []  # every batcher ever started (replaced arms stay alive for rollback)
        self.feedback = None
        self.started = time.time()


class BodyLimit:
    """ASGI middleware: answer 413 once a request body exceeds ``limit`` bytes (header or streamed)."""

    def __init__(self, app, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await _send_413(send, self.limit)
        seen = 0

        async def limited_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise _TooLargeError()
            return message

        try:
            await self.app(scope, limited_receive, send)
        except _TooLargeError:
            await _send_413(send, self.limit)


class _TooLargeError(Exception):
    pass


async def _send_413(send, limit: int) -> None:
    body = json.dumps(
        error_body(f"request body larger than {limit} bytes", "invalid_request_error", code="body_too_large")
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _key_of(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return request.headers.get("x-api-key")


def _matches(key: str | None, allowed: list[str]) -> bool:
    return key is not None and any(hmac.compare_digest(key.encode(), k.encode()) for k in allowed)


def check_user_key(state: ServerState, request: Request) -> None:
    """401 unless the request carries one of the API keys (no keys configured: open, loopback only)."""
    keys = state.settings.api_keys
    if keys and not _matches(_key_of(request), keys):
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
    if not _matches(_key_of(request), [admin]):
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


def create_app(state: ServerState) -> FastAPI:
    """The ASGI app over ``state``; routes live in :mod:`tandem.serve.routes`."""
    from tandem.serve.routes import register_routes

    app = FastAPI(title="Tandem", version="1", docs_url=None, redoc_url=None)
    app.state.tandem = state
    install_error_handlers(app)
    register_routes(app, state)

    @app.middleware("http")
    async def _count(request: Request, call_next) -> Response:
        started = time.perf_counter()
        response = await call_next(request)
        path = request.scope.get("route").path if request.scope.get("route") else "other"
        arm = response.headers.get("x-tandem-arm", "none")
        state.metrics.inc(
            "requests_total", 1, "HTTP requests.", path=path, status=str(response.status_code), arm=arm
        )
        state.metrics.observe(
            "request_latency_seconds",
            time.perf_counter() - started,
            help="Request latency (streams: until headers).",
            path=path,
            arm=arm,
        )
        return response

    app.add_middleware(BodyLimit, limit=state.settings.max_body_bytes)
    return app


def metrics_text(state: ServerState) -> PlainTextResponse:
    """The /metrics response (Prometheus text format 0.0.4)."""
    for arm in state.router.arms.values():
        state.metrics.set("queue_depth", arm.batcher.depth, "Rows waiting to be batched.", arm=arm.name)
        state.metrics.set("cache_entries", len(arm.cache), "Cached greedy responses.", arm=arm.name)
    return PlainTextResponse(state.metrics.render(), media_type="text/plain; version=0.0.4")
