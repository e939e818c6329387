"""The hostile-user probes of issue 11's audit against a running server: every expected bad input gets a
4xx in OpenAI's shape on a connection that stays open, the key is checked before the body is parsed,
one request cannot fail the others, admin changes reach every replica, and slow clients cannot hold
connections open."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from tandem.serve.server import build_state  # noqa: E402
from tandem.serve.state import ServeSettings  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from test_serve_api import Running, _free_port  # noqa: E402
from test_serve_security import _cli, _spawn, _stop  # noqa: E402

KEY, ADMIN = "k1", "adm"
AUTH = f"Authorization: Bearer {KEY}\r\n"


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    settings = ServeSettings(
        max_batch_size=32,
        max_wait_ms=20,
        api_keys=[KEY],
        admin_key=ADMIN,
        max_tokens_limit=16,
        max_body_bytes=64 * 1024,
        feedback_db=str(tmp_path_factory.mktemp("fb") / "feedback.db"),
    )
    running = Running(build_state({"main": str(tiny_model_dir)}, settings, name="tiny"))
    yield running
    running.stop()


def _request(path: str, body: bytes | None = None, headers: str = AUTH, method: str = "POST") -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: x\r\n{headers}"
    if body is None:
        return f"{head}\r\n".encode()
    return f"{head}Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body


def _read_response(sock: socket.socket) -> tuple[int, bytes]:
    """One response (status, body) from ``sock``; AssertionError when the server closed instead."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection dropped (got {data[:200]!r})"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        (
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        ),
        0,
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection dropped mid-body"
        body += chunk
    return int(head.split(b" ")[1]), body


def _one_connection(port: int, requests: list[bytes]) -> list[tuple[int, dict]]:
    """Send ``requests`` one after another on ONE keep-alive connection: a server that drops the
    connection after an error fails the next exchange."""
    out = []
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        for raw in requests:
            sock.sendall(raw)
            status, body = _read_response(sock)
            out.append((status, json.loads(body) if body.startswith(b"{") else {}))
    return out


OK = _request("/v1/completions", b'{"prompt": "1+1=", "max_tokens": 2}')


def _error(body: dict) -> dict:
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


def test_seed_overflow_does_not_fail_concurrent_innocent_requests(server):
    async def burst():
        headers = {"Authorization": f"Bearer {KEY}", "content-type": "application/json"}
        async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=60) as c:
            innocent = [
                json.dumps({"prompt": f"{i}+1=", "max_tokens": 4, "temperature": 0.8, "seed": i})
                for i in range(24)
            ]
            bad = '{"prompt": "1+1=", "max_tokens": 4, "temperature": 0.8, "seed": 18446744073709551616}'
            bodies = innocent[:12] + [bad] + innocent[12:]
            return await asyncio.gather(*(c.post("/v1/completions", content=b) for b in bodies))

    responses = asyncio.run(burst())
    bad = responses.pop(12)
    assert [r.status_code for r in responses] == [200] * 24
    assert bad.status_code in (400, 500) and _error(bad.json())["message"]


def test_empty_api_key_is_refused_at_startup_and_never_matches(server, tiny_model_dir, monkeypatch):
    for args in (["--api-key", ""], ["--api-key", "  "], ["--host", "0.0.0.0", "--api-key", ""]):
        r = _cli(["serve", str(tiny_model_dir), *args])
        assert r.exit_code == 2 and "--api-key" in r.output and "Traceback" not in r.output, r.output
    r = _cli(["serve", str(tiny_model_dir), "--admin-key", ""])
    assert r.exit_code == 2 and "--admin-key" in r.output
    monkeypatch.setenv("TANDEM_API_KEYS", " , ")  # blank entries are no keys: a public bind is refused
    r = _cli(["serve", str(tiny_model_dir), "--host", "0.0.0.0"])
    assert r.exit_code == 2 and "--host" in r.output
    statuses = _one_connection(
        server.port, [_request("/v1/models", headers="X-API-Key: \r\n", method="GET"), OK]
    )
    assert [s for s, _ in statuses] == [401, 200]


@pytest.mark.parametrize("weight", [b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-1", b"true"])
def test_nan_or_infinite_split_weight_is_400_and_the_service_stays_up(server, weight):
    admin = f"Authorization: Bearer {ADMIN}\r\n"
    split = _request("/admin/split", b'{"weights": {"main": ' + weight + b"}}", headers=admin)
    arms = _request("/admin/arms", headers=admin, method="GET")
    ready = _request("/ready", method="GET")
    (s1, e), (s2, a), (s3, _), (s4, _) = _one_connection(server.port, [split, arms, ready, OK])
    assert s1 == 400 and _error(e)["param"] == "weights"
    assert (s2, a["split"], s3, s4) == (200, {"main": 1.0}, 200, 200)


def test_json_nested_5k_deep_is_401_before_the_key_and_400_after(server):
    deep = b'{"prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    results = _one_connection(
        server.port, [_request("/v1/completions", deep, headers=""), _request("/v1/completions", deep), OK]
    )
    assert [s for s, _ in results] == [401, 400, 200]
    assert _error(results[0][1])["type"] == "authentication_error"
    assert _error(results[1][1])["code"] == "json_too_deep"


def test_lone_surrogate_in_a_prompt_is_400(server):
    chat = b'{"messages": [{"role": "user", "content": "hi \\ud800"}], "max_tokens": 2}'
    results = _one_connection(
        server.port,
        [
            _request("/v1/completions", b'{"prompt": "1\\ud800+1=", "max_tokens": 2}'),
            _request("/v1/chat/completions", chat),
            _request("/v1/completions", b'{"prompt": "\\ud83d\\ude00", "max_tokens": 2}'),  # a valid pair
        ],
    )
    assert [s for s, _ in results] == [400, 400, 200]
    assert _error(results[0][1])["code"] == "invalid_unicode"


def test_chunked_body_over_the_size_limit_is_413(server):
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: x\r\n{AUTH}Content-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
    ).encode()
    chunk = b'{"prompt": "' + b"x" * 40000
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(head)
        for _ in range(3):  # 120 kB > 64 kB, never declared up front
            sock.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
        status, body = _read_response(sock)
    assert status == 413 and _error(json.loads(body))["code"] == "body_too_large"


def test_hostile_chat_template_is_a_one_line_startup_error(tiny_model_dir, tmp_path):
    bad = tmp_path / "hostile"
    shutil.copytree(tiny_model_dir, bad)
    config = json.loads((bad / "tokenizer_config.json").read_text())
    config["chat_template"] = "{{ ''.__class__.__mro__[1].__subclasses__() }}"
    (bad / "tokenizer_config.json").write_text(json.dumps(config))
    r = _cli(["serve", str(bad)])
    assert r.exit_code == 2 and "chat template" in r.output and "Traceback" not in r.output, r.output


def _stream_id(client: httpx.Client, path: str, body: dict) -> str:
    with client.stream("POST", path, json={**body, "stream": True}) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    return json.loads(lines[0][6:])["id"]


def test_streamed_completions_are_stored_for_feedback(server):
    with server.client(KEY) as c:
        rid = _stream_id(c, "/v1/completions", {"prompt": "3+4=", "max_tokens": 3})
        cid = _stream_id(c, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
        assert c.post("/v1/feedback", json={"id": rid, "rating": 1}).status_code == 200
        assert c.post("/v1/feedback", json={"id": cid, "rating": 0}).status_code == 200
    assert server.state.feedback.lookup(rid)[1] == ["3+4="]


@pytest.mark.parametrize("rating", [b"NaN", b"Infinity", b"1e400", b"2", b"-1.5"])
def test_non_finite_or_out_of_range_rating_is_400(server, rating):
    with server.client(KEY) as c:
        rid = c.post("/v1/completions", json={"prompt": "5+5=", "max_tokens": 2}).json()["id"]
        r = c.post(
            "/v1/feedback",
            content=b'{"id": "' + rid.encode() + b'", "rating": ' + rating + b"}",
            headers={"content-type": "application/json"},
        )
    assert r.status_code == 400 and _error(r.json())["param"] == "rating"
    assert all(row["response_id"] != rid for row in server.state.feedback.rows())


def test_pairing_a_response_with_itself_is_400(server):
    with server.client(KEY) as c:
        rid = c.post("/v1/completions", json={"prompt": "6+6=", "max_tokens": 2}).json()["id"]
        r = c.post("/v1/feedback", json={"id": rid, "other_id": rid, "preferred": rid})
    assert r.status_code == 400 and "different response" in _error(r.json())["message"]


def test_openapi_and_docs_need_the_key(server):
    with server.client(key=None) as c:
        assert [c.get(p).status_code for p in ("/openapi.json", "/docs", "/redoc")] == [401, 401, 401]
        assert c.get("/health").status_code == 200 and c.get("/ready").status_code == 200
    with server.client(KEY) as c:
        assert c.get("/openapi.json").status_code == 200


def test_models_list_shows_a_name_not_the_path(server, tiny_model_dir):
    with server.client(KEY) as c:
        text = c.get("/v1/models").text
    assert str(Path(tiny_model_dir).parent) not in text
    assert json.loads(text)["data"][1]["root"] == Path(tiny_model_dir).name


def test_missing_or_bad_tls_files_are_one_line_errors(tiny_model_dir, tmp_path):
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate")
    for args, where in (
        (["--ssl-certfile", str(tmp_path / "missing.pem")], "--ssl-certfile"),
        (["--ssl-keyfile", str(junk)], "--ssl-keyfile"),
        (["--ssl-certfile", str(junk)], "--ssl-certfile"),
    ):
        r = _cli(["serve", str(tiny_model_dir), *args])
        assert r.exit_code == 2 and where in r.output and "Traceback" not in r.output, r.output


def test_unhandled_error_is_a_json_500_on_a_kept_connection(server, monkeypatch):
    def broken(*_args, **_kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(server.state.router, "pick", broken)
    (s1, body), (s2, _) = _one_connection(server.port, [OK, _request("/health", method="GET")])
    assert s1 == 500 and _error(body)["code"] == "internal_error" and s2 == 200


def test_slow_clients_are_cut_off_and_connections_are_bounded(tiny_model_dir):
    settings = ServeSettings(read_timeout_s=1.0, max_connections=7, max_tokens_limit=8)
    running = Running(build_state({"main": str(tiny_model_dir)}, settings, name="tiny"))
    try:
        port = running.port
        head = socket.create_connection(("127.0.0.1", port), timeout=10)
        head.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")  # slowloris: the head never ends
        body = socket.create_connection(("127.0.0.1", port), timeout=10)
        body.sendall(_request("/v1/completions", b'{"prompt": "1"}', headers="")[:-5])  # body never ends
        time.sleep(0.3)
        idle = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(4)]
        time.sleep(0.2)
        assert _one_connection(port, [_request("/health", method="GET")])[0][0] == 503  # the 7th of 7
        started = time.time()
        assert head.recv(1024) == b""  # closed by the head deadline
        status, _ = _read_response(body)
        assert status == 408 and time.time() - started < 5
        for sock in [head, body, *idle]:
            sock.close()
        time.sleep(0.3)
        assert _one_connection(port, [_request("/health", method="GET")])[0][0] == 200
    finally:
        running.stop()


@pytest.mark.slow
def test_admin_changes_reach_every_replica(tiny_model_dir, tmp_path):
    port = _free_port()
    args = [str(tiny_model_dir), "--arm", f"b={tiny_model_dir}", "--workers", "2", "--admin-key", ADMIN]
    proc = _spawn(args, port, env={"TMPDIR": str(tmp_path)})
    url, headers = f"http://127.0.0.1:{port}", {"Authorization": f"Bearer {ADMIN}"}

    def views(n: int = 16) -> list[dict]:
        out = []
        for _ in range(n):  # a new connection each time: the kernel spreads them over the workers
            with httpx.Client(base_url=url, headers=headers, timeout=30) as c:
                out.append(c.get("/admin/arms").json())
        return out

    try:
        seen = views()
        deadline = time.time() + 30
        while len({v["replica"] for v in seen}) < 2 and time.time() < deadline:
            seen += views(4)
        assert len({v["replica"] for v in seen}) == 2
        with httpx.Client(base_url=url, headers=headers, timeout=60) as c:
            assert c.post("/admin/split", json={"weights": {"main": 1, "b": 3}}).status_code == 200
        for view in views():
            assert view["split"] == {"main": 0.25, "b": 0.75}, view
        with httpx.Client(base_url=url, headers=headers, timeout=60) as c:
            assert c.post("/admin/promote", json={"arm": "b"}).status_code == 200
        for _ in range(12):  # every replica now serves b (it used to alternate with the old split)
            with httpx.Client(base_url=url, timeout=60) as c:
                r = c.post("/predict", json={"text": "1+1=", "max_tokens": 2})
                assert (r.status_code, r.headers["x-tandem-arm"]) == (200, "b")
        with httpx.Client(base_url=url, headers=headers, timeout=120) as c:
            r = c.post("/admin/load", json={"arm": "c", "path": str(tiny_model_dir), "weight": 1})
            assert r.status_code == 200 and r.json()["split"] == {"main": 0.0, "b": 0.5, "c": 0.5}
        deadline, caught_up = time.time() + 90, set()
        while len(caught_up) < 2 and time.time() < deadline:  # the other replica loads c, then switches
            caught_up |= {v["replica"] for v in views(4) if v["split"].get("c") == 0.5}
        assert len(caught_up) == 2
        with httpx.Client(base_url=url, headers=headers, timeout=60) as c:
            assert c.post("/admin/rollback").status_code == 200
        assert all(v["split"] == {"main": 0.0, "b": 1.0} and "c" not in v["arms"] for v in views())
    finally:
        _stop(proc)
    assert not list(tmp_path.glob("tandem-serve-*"))  # the shared admin state is removed on exit
