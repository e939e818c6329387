"""The server's cheaper per-request paths keep behaviour: ``Front`` sends only the generation POSTs past
FastAPI, the lean JSON response has ``JSONResponse``'s bytes and headers, response ids are version-4 UUIDs,
metrics series do not depend on the order labels are passed in, and the request-head deadline, now armed
once per connection rather than once per request, still counts from the last response."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import uuid

import pytest

pytest.importorskip("fastapi")

from starlette.responses import JSONResponse  # noqa: E402

from tandem.serve.app import BodyResponse  # noqa: E402
from tandem.serve.direct import Front  # noqa: E402
from tandem.serve.metrics import Metrics  # noqa: E402
from tandem.serve.routes import CancelFlag, response_id  # noqa: E402


def _front() -> tuple[Front, list[str]]:
    seen: list[str] = []

    async def app(scope, receive, send):
        seen.append(f"app {scope['type']} {scope.get('method', '')} {scope.get('path', '')}".strip())

    async def direct(scope, receive, send):
        seen.append(f"direct {scope['method']} {scope['path']} app={scope['app'] is app}")

    app.routes = ["r"]  # type: ignore[attr-defined]
    return Front(app, direct, {"/v1/completions"}), seen


def test_front_sends_only_generation_posts_to_the_direct_chain():
    front, seen = _front()

    async def call(scope):
        await front(scope, None, None)

    for scope in [
        {"type": "http", "method": "POST", "path": "/v1/completions"},
        {"type": "http", "method": "GET", "path": "/v1/completions"},
        {"type": "http", "method": "POST", "path": "/v1/models"},
        {"type": "lifespan"},
    ]:
        asyncio.run(call(scope))
    assert seen == [
        "direct POST /v1/completions app=True",
        "app http GET /v1/completions",
        "app http POST /v1/models",
        "app lifespan",
    ]
    assert front.routes == ["r"]  # other attributes are the FastAPI app's
    with pytest.raises(AttributeError):
        _ = front.no_such_attribute


@pytest.mark.parametrize(
    "body",
    [
        {
            "id": "cmpl-1",
            "choices": [{"text": "caf\u00e9 \u2713 \u4e2d", "logprobs": None}],
            "x": [1.5, 1e-05, True],
        },
        {},
    ],
)
def test_body_response_has_json_responses_bytes_and_headers(body):
    lean, starlette = (
        BodyResponse(body, {"X-Tandem-Arm": "main"}),
        JSONResponse(body, headers={"X-Tandem-Arm": "main"}),
    )
    assert (lean.status_code, lean.body, lean.raw_headers) == (200, starlette.body, starlette.raw_headers)
    with pytest.raises(ValueError):  # NaN is refused as JSONResponse refuses it
        BodyResponse({"x": float("nan")}, {})


def test_response_ids_are_version_4_uuids():
    ids = {response_id() for _ in range(200)}
    assert len(ids) == 200
    for rid in ids:
        parsed = uuid.UUID(rid)
        assert parsed.hex == rid and parsed.version == 4 and parsed.variant == uuid.RFC_4122


def test_cancel_flag_is_an_event_for_the_rows():
    flag = CancelFlag()
    assert not flag.is_set()
    flag.set()
    assert flag.is_set()


def test_metrics_series_do_not_depend_on_label_order():
    m = Metrics()
    m.inc("requests_total", 1, "HTTP requests.", path="/a", status="200")
    m.inc("requests_total", 2, "HTTP requests.", status="200", path="/a")
    m.observe("latency", 0.02, path="/a", arm="x")
    m.observe("latency", 0.2, arm="x", path="/a")
    assert m.counter_value("requests_total", status="200", path="/a") == 3
    text = m.render()
    assert 'tandem_requests_total{path="/a",status="200"} 3' in text
    assert 'tandem_latency_count{arm="x",path="/a"} 2' in text


def _serve(timeout_s: float):
    """uvicorn with the head-deadline protocol on a free port, in a thread; returns (port, stop)."""
    import uvicorn

    from tandem.serve.connections import protocol_for

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error", http=protocol_for(timeout_s))
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 20
    while not server.started and time.time() < deadline:
        time.sleep(0.02)

    def stop() -> None:
        server.should_exit = True
        thread.join(10)

    return port, stop


def _get(sock: socket.socket) -> bytes:
    sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    data = b""
    while not data.endswith(b"ok"):
        chunk = sock.recv(1024)
        if not chunk:
            break
        data += chunk
    return data


def test_head_deadline_counts_from_the_last_response():
    port, stop = _serve(0.6)
    try:
        busy = socket.create_connection(("127.0.0.1", port), timeout=10)
        for _ in range(5):  # a request every 0.3 s for 1.5 s: never 0.6 s without a head
            assert _get(busy).startswith(b"HTTP/1.1 200")
            time.sleep(0.3)
        last = time.time()
        assert _get(busy).startswith(b"HTTP/1.1 200")
        busy.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")  # a head that never ends
        assert busy.recv(1024) == b""  # closed ...
        waited = time.time() - last
        assert 0.5 < waited < 3.0, waited  # ... 0.6 s after the last response, not earlier
        busy.close()
    finally:
        stop()


def test_only_a_serving_process_freezes_its_heap():
    import gc
    import subprocess
    import sys

    from tandem.serve import heap

    before = gc.get_freeze_count()
    heap.refreeze()  # this (test) process never froze: nothing happens
    assert gc.get_freeze_count() == before
    code = (
        "import gc; from tandem.serve import heap; keep = [[i] for i in range(1000)]; heap.freeze(); "
        "n = gc.get_freeze_count(); more = [[i] for i in range(1000)]; heap.refreeze(); "
        "print(n >= 1000, gc.get_freeze_count() >= n + 1000, gc.get_count()[0] < 100)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.split() == ["True", "True", "True"], out
