"""What the routes share besides the state (:mod:`tandem.serve.state`): key checks, JSON body parsing,
error handlers.

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

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from tandem.serve.batcher import RowFailedError
from tandem.serve.middleware import key_from_headers, key_matches
from tandem.serve.protocol import ApiError, error_body, validation_param
from tandem.serve.state import ServerState

logger = logging.getLogger(__name__)


_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")
# Deepest nesting a body may have (the body's object is level 1). OpenAI-style bodies nest < 10 levels, a
# JSON schema in `tools` or `response_format` a few dozen. A fixed limit, because the parser's own limit is
# the interpreter's: Python 3.11 refuses 5000 levels, 3.12 parses them (its limit is the C stack's).
MAX_JSON_DEPTH = 128


def json_depth_exceeds(data: object, limit: int) -> bool:
    """Whether ``data`` nests dicts/lists deeper than ``limit`` levels (iterative: no recursion)."""
    stack = [(data, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False


def _too_deep() -> ApiError:
    return ApiError(400, f"body is nested more than {MAX_JSON_DEPTH} levels deep", code="json_too_deep")


def parse_json_object(raw: bytes) -> dict:
    """The JSON object of a request body; 400 (never 500) for invalid JSON, nesting deeper than
    ``MAX_JSON_DEPTH`` (or than the parser goes), a lone UTF-16 surrogate escape (``"\\ud800"``: not
    text, and it breaks tokenizers and SQLite), or a value that is not an object."""
    try:
        data = json.loads(raw or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ApiError(400, f"body is not valid JSON: {err}", code="json_invalid") from err
    except RecursionError as err:
        raise _too_deep() from err
    # Depth needs that many brackets; counting them (C speed) spares the walk for nearly every body.
    if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH and json_depth_exceeds(data, MAX_JSON_DEPTH):
        raise _too_deep()
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


_JSON = b"application/json"
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))  # JSONResponse's


class BodyResponse(JSONResponse):
    """A ``JSONResponse`` (status 200) with the same bytes and headers, built for the generation routes'
    hot path: one prebuilt encoder with ``JSONResponse.render``'s options, and the header list written
    out instead of going through Starlette's generic header handling (33 -> 20 us, measured under load)."""

    def __init__(self, content: object, headers: dict[str, str]) -> None:
        self.status_code, self.background = 200, None
        self.body = _ENCODER.encode(content).encode("utf-8")
        self.raw_headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        self.raw_headers += [(b"content-length", str(len(self.body)).encode()), (b"content-type", _JSON)]


def header(request: Request, name: bytes) -> str | None:
    """The first value of header ``name`` (lower case), as ``request.headers.get`` gives it, read from
    the raw scope without building Starlette's ``Headers``."""
    for key, value in request.scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


async def read_body(request: Request) -> bytes:
    """The request body, as ``await request.body()`` reads it (``ClientDisconnect`` if the client goes
    away first), straight from ``receive``: Starlette's async generator costs more than the read."""
    chunks = []
    while True:
        message = await request.receive()
        if message["type"] == "http.request":
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                return b"".join(chunks)
        elif message["type"] == "http.disconnect":
            raise ClientDisconnect()


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


async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
    first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
    param = validation_param(tuple(first.get("loc", ())))
    kind = first.get("type", "")
    message = "body is not valid JSON" if kind == "json_invalid" else f"{param or 'body'}: {first['msg']}"
    return JSONResponse(error_body(message, "invalid_request_error", param, kind or None), status_code=400)


async def _row_failed(request: Request, exc: RowFailedError) -> JSONResponse:
    return JSONResponse(error_body(str(exc), "server_error", None, "generation_failed"), status_code=500)


async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    return JSONResponse(
        error_body(str(exc.detail), "invalid_request_error", None, code), status_code=exc.status_code
    )


async def _bug(request: Request, exc: Exception) -> JSONResponse:
    logger.exception("unhandled error on %s", request.url.path)
    return JSONResponse(
        error_body("internal server error", "server_error", None, "internal_error"), status_code=500
    )


# Expected errors and their responses; anything else is a bug (``_bug``: logged, 500).
ERROR_HANDLERS = {
    ApiError: _api_error,
    RequestValidationError: _invalid,
    RowFailedError: _row_failed,
    StarletteHTTPException: _http,
}


def error_handler(exc: Exception):
    """The handler of ``exc`` in :data:`ERROR_HANDLERS` (nearest class first, as Starlette looks them
    up), or None for a bug."""
    for kind in type(exc).__mro__:
        if kind in ERROR_HANDLERS:
            return ERROR_HANDLERS[kind]
    return None


def install_error_handlers(app: FastAPI) -> None:
    """Every error as ``{"error": {...}}``: validation 400, HTTP errors their status, bugs 500."""
    for kind, handler in ERROR_HANDLERS.items():
        app.add_exception_handler(kind, handler)
    app.add_exception_handler(Exception, _bug)


def metrics_text(state: ServerState) -> PlainTextResponse:
    """The /metrics response (Prometheus text format 0.0.4)."""
    for arm in state.router.arms.values():
        state.metrics.set("queue_depth", arm.batcher.depth, "Rows waiting to be batched.", arm=arm.name)
        state.metrics.set("cache_entries", len(arm.cache), "Cached greedy responses.", arm=arm.name)
        arm.batcher.pool.publish()
    return PlainTextResponse(state.metrics.render(), media_type="text/plain; version=0.0.4")
