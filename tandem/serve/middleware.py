"""Pure ASGI middleware around the routes: the key check, metrics and a connection-keeping 500 (``Gate``),
and the body size and read-time limits (``BodyLimit``).

Order (outermost first): ``Gate`` → ``BodyLimit`` → FastAPI's routes. The key is checked from the
headers before any byte of the body is read, so an unauthenticated client cannot make the server parse
anything. Both are plain ASGI callables rather than ``@app.middleware("http")``: an exception raised
inside Starlette's ``BaseHTTPMiddleware`` reaches outer layers wrapped in an ``ExceptionGroup``, and an
unhandled exception that reaches uvicorn closes the keep-alive connection; here a bug is answered with
an OpenAI-shaped 500 on a connection that stays open.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from collections.abc import Callable, Iterable

from tandem.serve.protocol import error_body

logger = logging.getLogger(__name__)

OPEN_PATHS = frozenset({"/health", "/ready"})  # probes: never need a key
ADMIN_PREFIX = "/admin/"  # the admin routes check the admin key themselves, before reading the body


def key_from_headers(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The API key a request presents: ``Authorization: Bearer KEY`` or ``X-API-Key: KEY``."""
    values = {name.lower(): value for name, value in headers}
    auth = values.get(b"authorization", b"").decode("latin-1")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    key = values.get(b"x-api-key")
    return None if key is None else key.decode("latin-1").strip()


def key_matches(key: str | None, allowed: Iterable[str]) -> bool:
    """Constant-time comparison against every allowed key; an empty key never matches."""
    if not key:
        return False
    return any(hmac.compare_digest(key.encode(), k.encode()) for k in allowed if k)


async def send_json(send, status: int, body: dict) -> None:
    """Send a complete JSON response."""
    data = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


class Gate:
    """Keys, admin-state sync, request metrics, and a 500 that keeps the connection.

    ``api_keys``: a request to anything but ``/health``, ``/ready`` and the admin API needs one of them
    (none configured: open). ``before()`` runs first on every request (the replica catching up with the
    shared admin state). ``metrics``: counts ``requests_total{path,status,arm}`` and observes the latency
    until the response headers; ``paths`` are the route paths used as labels (anything else is
    ``other``, so a scanner cannot grow the label set)."""

    def __init__(
        self, app, *, api_keys: list[str], metrics, paths: set[str], before: Callable[[], None]
    ) -> None:
        self.app, self.keys, self.metrics, self.paths, self.before = app, api_keys, metrics, paths, before

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        path = scope.get("path", "")
        label = path if path in self.paths else "other"
        sent: dict = {}

        async def observed_send(message) -> None:
            if message["type"] == "http.response.start":
                sent["status"] = message["status"]
                headers = dict(message.get("headers") or [])
                sent["arm"] = headers.get(b"x-tandem-arm", b"none").decode("latin-1")
                self._observe(scope, label, sent, started)
            await send(message)

        if self._needs_key(path) and not key_matches(key_from_headers(scope.get("headers") or []), self.keys):
            body = error_body(
                "missing or invalid API key (send 'Authorization: Bearer <key>')",
                "authentication_error",
                code="invalid_api_key",
            )
            return await send_json(observed_send, 401, body)
        try:
            self.before()
            await self.app(scope, receive, observed_send)
        except Exception:
            if sent:  # the response has started (a stream broke): only closing the connection is left
                raise
            logger.exception("unhandled error on %s", path)
            body = error_body("internal server error", "server_error", None, "internal_error")
            await send_json(observed_send, 500, body)

    def _needs_key(self, path: str) -> bool:
        return bool(self.keys) and path not in OPEN_PATHS and not path.startswith(ADMIN_PREFIX)

    def _observe(self, scope, label: str, sent: dict, started: float) -> None:
        route = scope.get("route")
        path = getattr(route, "path", None) or label
        arm = sent["arm"]
        self.metrics.inc(
            "requests_total", 1, "HTTP requests.", path=path, status=str(sent["status"]), arm=arm
        )
        self.metrics.observe(
            "request_latency_seconds",
            time.perf_counter() - started,
            help="Request latency (streams: until headers).",
            path=path,
            arm=arm,
        )


class _TooLargeError(Exception):
    pass


class _SlowBodyError(Exception):
    pass


def _find(err: BaseException, kinds: tuple[type[BaseException], ...]) -> BaseException | None:
    """``err`` or the first exception of ``kinds`` inside it (exception groups are searched)."""
    if isinstance(err, kinds):
        return err
    for inner in getattr(err, "exceptions", ()):  # an ExceptionGroup (Python >= 3.11 or the backport)
        if isinstance(inner, BaseException) and (found := _find(inner, kinds)) is not None:
            return found
    return None


class BodyLimit:
    """413 once a body exceeds ``limit`` bytes (declared or streamed); 408 when the body has not fully
    arrived ``timeout_s`` after the request began (a client trickling bytes cannot hold a request open).
    The request head has its own deadline in :mod:`tandem.serve.connections`."""

    def __init__(self, app, limit: int, timeout_s: float) -> None:
        self.app, self.limit, self.timeout_s = app, limit, timeout_s

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await _too_large(send, self.limit)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        state = {"seen": 0, "done": False}

        async def limited_receive():
            if state["done"]:
                return await receive()
            try:
                message = await within_deadline(receive(), max(deadline - loop.time(), 0.0))
            except asyncio.TimeoutError:
                raise _SlowBodyError() from None
            if message["type"] != "http.request" or not message.get("more_body", False):
                state["done"] = True
            if message["type"] == "http.request":
                state["seen"] += len(message.get("body", b""))
                if state["seen"] > self.limit:
                    raise _TooLargeError()
            return message

        try:
            await self.app(scope, limited_receive, send)
        except Exception as err:
            found = _find(err, (_TooLargeError, _SlowBodyError))
            if found is None:
                raise
            if isinstance(found, _TooLargeError):
                await _too_large(send, self.limit)
            else:
                body = error_body(
                    f"request body not received within {self.timeout_s:g} s",
                    "invalid_request_error",
                    code="request_timeout",
                )
                await send_json(send, 408, body)


_timeout = getattr(asyncio, "timeout", None)  # Python >= 3.11


async def within_deadline(awaitable, seconds: float):
    """``await awaitable``, raising :class:`asyncio.TimeoutError` after ``seconds``. On Python >= 3.11 this
    runs in the caller's task (``asyncio.timeout``); ``asyncio.wait_for`` wraps every receive in a new task."""
    if _timeout is None:
        return await asyncio.wait_for(awaitable, seconds)
    async with _timeout(seconds):
        return await awaitable


async def _too_large(send, limit: int) -> None:
    body = error_body(
        f"request body larger than {limit} bytes", "invalid_request_error", code="body_too_large"
    )
    await send_json(send, 413, body)
