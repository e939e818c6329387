"""Direct dispatch of the generation routes answers as the FastAPI route would: the endpoint's response,
its expected errors through the same handlers, bugs raised to ``Gate``, other paths and methods passed on."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("fastapi")

from fastapi.responses import JSONResponse  # noqa: E402

from tandem.serve.app import error_handler  # noqa: E402
from tandem.serve.batcher import RowFailedError  # noqa: E402
from tandem.serve.direct import Direct  # noqa: E402
from tandem.serve.protocol import ApiError  # noqa: E402


def _call(app, method: str, path: str) -> list[dict]:
    scope = {"type": "http", "method": method, "path": path, "headers": [], "query_string": b""}
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message):
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return sent


def _direct(outcome):
    async def endpoint(request):
        if isinstance(outcome, Exception):
            raise outcome
        return JSONResponse(outcome)

    async def inner(scope, receive, send):
        await JSONResponse({"routed": scope["path"]})(scope, receive, send)

    return Direct(inner, {"/v1/completions": endpoint})


def test_direct_runs_the_endpoint_and_passes_the_rest_on():
    app = _direct({"ok": 1})
    assert json.loads(_call(app, "POST", "/v1/completions")[1]["body"]) == {"ok": 1}
    assert json.loads(_call(app, "GET", "/v1/completions")[1]["body"]) == {"routed": "/v1/completions"}
    assert json.loads(_call(app, "POST", "/v1/models")[1]["body"]) == {"routed": "/v1/models"}


def test_direct_answers_expected_errors_with_the_apps_handlers():
    sent = _call(_direct(ApiError(400, "max_tokens: too big", param="max_tokens")), "POST", "/v1/completions")
    assert sent[0]["status"] == 400
    assert json.loads(sent[1]["body"])["error"]["param"] == "max_tokens"
    sent = _call(_direct(RowFailedError("boom")), "POST", "/v1/completions")
    assert sent[0]["status"] == 500
    assert json.loads(sent[1]["body"])["error"]["code"] == "generation_failed"
    with pytest.raises(KeyError):  # a bug: Gate (outside) answers it with a 500 and logs it
        _call(_direct(KeyError("bug")), "POST", "/v1/completions")


def test_error_handler_looks_up_the_nearest_class():
    class NarrowerError(ApiError):
        pass

    assert error_handler(NarrowerError(400, "x")) is error_handler(ApiError(400, "x"))
    assert error_handler(ValueError("x")) is None
