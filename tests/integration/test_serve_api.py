"""`tandem serve` end to end: a real uvicorn server on 127.0.0.1, the official openai client, errors,
keys, body limit, cache, dynamic batching, A/B admin API and durable feedback."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

from tandem.serve.server import build_state, make_app  # noqa: E402
from tandem.serve.state import ServeSettings  # noqa: E402

USER_KEY, ADMIN_KEY = "user-key-1", "admin-key-1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Running:
    """A uvicorn server in a thread, stopped by the fixture."""

    def __init__(self, state) -> None:
        import uvicorn

        self.state = state
        self.port = _free_port()
        from tandem.serve.connections import uvicorn_limits

        limits = uvicorn_limits(state.settings)  # the connection limits `tandem serve` runs with
        config = uvicorn.Config(
            make_app(state), host="127.0.0.1", port=self.port, log_level="error", **limits
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 20
        while not self.server.started:
            assert time.time() < deadline, "server did not start"
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.port}"

    def client(self, key: str | None = USER_KEY) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=20)


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    settings = ServeSettings(
        max_batch_size=8,
        max_wait_ms=20,
        api_keys=[USER_KEY],
        admin_key=ADMIN_KEY,
        max_tokens_limit=64,
        max_body_bytes=4096,
        feedback_db=str(tmp_path_factory.mktemp("fb") / "feedback.db"),
    )
    running = Running(build_state({"main": str(tiny_model_dir)}, settings, name="tiny"))
    yield running
    running.stop()


def _oai(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=USER_KEY, max_retries=0)


def test_openai_client_completions_plain_and_streaming(server):
    client = _oai(server)
    done = client.completions.create(model="tiny", prompt="12+3=", max_tokens=6, temperature=0)
    assert done.choices[0].finish_reason in ("stop", "length") and done.usage.completion_tokens >= 1
    chunks = list(
        client.completions.create(model="tiny", prompt="12+3=", max_tokens=6, temperature=0, stream=True)
    )
    streamed = "".join(c.choices[0].text for c in chunks)
    assert streamed == done.choices[0].text  # same greedy text, whether streamed or not
    assert chunks[-1].choices[0].finish_reason == done.choices[0].finish_reason


def test_openai_client_chat_plain_and_streaming(server):
    client = _oai(server)
    messages = [{"role": "user", "content": "hi"}]
    done = client.chat.completions.create(model="tiny", messages=messages, max_tokens=5, temperature=0)
    assert done.choices[0].message.role == "assistant"
    stream = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=5, temperature=0, stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream)
    assert text == done.choices[0].message.content
    assert [m.id for m in client.models.list().data][0] == "tiny"


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        (b"{not json", 400, None),
        (b"[1, 2]", 400, None),
        (b'{"prompt": 3}', 400, "prompt"),
        (b'{"prompt": "a", "max_tokens": 100000}', 400, "max_tokens"),
        (b'{"prompt": "a", "n": 99}', 400, "n"),
        (b'{"prompt": "a", "temperature": -1}', 400, "temperature"),
        (b'{"prompt": "' + b"x" * 200 + b'", "max_tokens": 64}', 400, "prompt"),  # beyond the context (256)
        (b'{"prompt": "a", "model": "other"}', 404, "model"),
        (b'{"prompt": "' + b"x" * 5000 + b'"}', 413, None),
    ],
)
def test_bad_input_gets_openai_error_shape(server, body, status, param):
    with server.client() as c:
        r = c.post("/v1/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param


def test_api_key_required_and_user_key_cannot_use_admin(server):
    with server.client(key=None) as c:
        assert c.post("/v1/completions", json={"prompt": "a"}).status_code == 401
        assert c.get("/health").status_code == 200
    with server.client(key="wrong") as c:
        assert c.post("/predict", json={"text": "a"}).status_code == 401
    with server.client(key=USER_KEY) as c:
        r = c.post("/admin/split", json={"weights": {"main": 1}})
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"


def test_predict_and_cache_hit_for_greedy(server):
    with server.client() as c:
        first = c.post("/predict", json={"text": "7*8="}).json()
        hits = server.state.metrics.counter_value("cache_lookups_total", arm="main", result="hit")
        second = c.post("/predict", json={"text": "7*8="}).json()
        assert second == first
        assert server.state.metrics.counter_value("cache_lookups_total", arm="main", result="hit") == hits + 1
        metrics = c.get("/metrics").text
    assert 'tandem_requests_total{arm="main",path="/predict",status="200"}' in metrics
    assert "tandem_batch_size_bucket" in metrics and "tandem_queue_depth" in metrics


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"text": "12+34=", "max_tokens": "3"}, "max_tokens"),  # /v1/completions refuses this too
        ({"text": "12+34=", "max_tokens": 3.0}, "max_tokens"),
        ({"text": "12+34=", "max_tokens": True}, "max_tokens"),
        ({"text": "12+34=", "max_tokens": 0}, "max_tokens"),
        ({"text": 12}, "text"),
        ({}, "text"),
    ],
)
def test_predict_is_as_strict_as_completions(server, body, param):
    with server.client() as c:
        r = c.post("/predict", json=body)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == param
        if "max_tokens" in body:
            same = c.post("/v1/completions", json={"prompt": body["text"], "max_tokens": body["max_tokens"]})
            assert same.status_code == 400 and same.json()["error"]["param"] == param
        assert c.post("/predict", json={"text": "12+34=", "max_tokens": 3}).status_code == 200


def test_concurrent_requests_are_batched_with_their_own_params(server):
    async def many():
        headers = {"Authorization": f"Bearer {USER_KEY}"}
        async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=30) as c:
            bodies = [
                {"prompt": f"{i}+1=", "max_tokens": 3 + i % 3, "temperature": 0.7 * (i % 2), "seed": i}
                for i in range(8)
            ]
            return await asyncio.gather(*(c.post("/v1/completions", json=b) for b in bodies))

    before = server.state.metrics.render()
    responses = asyncio.run(many())
    assert all(r.status_code == 200 for r in responses)
    for i, r in enumerate(responses):
        assert r.json()["usage"]["completion_tokens"] <= 3 + i % 3
    batches = [
        line
        for line in server.state.metrics.render().splitlines()
        if line.startswith("tandem_batch_size_count")
    ]
    assert batches and before != server.state.metrics.render()
    hist = server.state.metrics._hists["batch_size"][1]
    sizes_sum = sum(row[-2] for row in hist.values())
    counts = sum(row[-1] for row in hist.values())
    assert sizes_sum / counts > 1.0  # some batch held more than one request


def test_admin_load_split_promote_rollback_and_feedback(server, tiny_model_dir, tmp_path):
    admin = server.client(key=ADMIN_KEY)
    for weight in ("x", True):  # a wrong-typed weight is a 400 naming it, not a 500
        bad = admin.post("/admin/load", json={"arm": "b", "path": str(tiny_model_dir), "weight": weight})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "weight", bad.text
        assert "must be a number" in bad.json()["error"]["message"]
    r = admin.post("/admin/load", json={"arm": "b", "path": str(tiny_model_dir), "weight": 1.0})
    assert r.status_code == 200 and r.json()["split"] == {"main": 0.5, "b": 0.5}
    with server.client() as c:
        arms = {
            c.post("/predict", json={"text": "1"}, headers={"x-tandem-user": "alice"}).status_code
            for _ in range(2)
        }
        assert arms == {200}
        sticky = {
            c.post("/v1/completions", json={"prompt": "1", "user": "bob", "max_tokens": 2}).headers[
                "x-tandem-arm"
            ]
            for _ in range(4)
        }
        assert len(sticky) == 1
    assert admin.post("/admin/promote", json={"arm": "b"}).json()["split"] == {"main": 0.0, "b": 1.0}
    assert admin.post("/admin/promote", json={"arm": "zzz"}).status_code == 404
    assert admin.post("/admin/rollback").json()["split"] == {"main": 0.5, "b": 0.5}
    assert admin.post("/admin/rollback").json()["split"] == {"main": 1.0}
    assert admin.post("/admin/split", json={"weights": {"nope": 1}}).status_code == 400
    admin.close()
    with server.client() as c:
        a = c.post("/v1/completions", json={"prompt": "2+2=", "max_tokens": 3, "seed": 0}).json()
        for seed in range(1, 20):  # a pair of identical answers is refused: sample until the texts differ
            b = c.post("/v1/completions", json={"prompt": "2+2=", "max_tokens": 3, "seed": seed}).json()
            if b["choices"][0]["text"] != a["choices"][0]["text"]:
                break
        ok = c.post("/v1/feedback", json={"id": a["id"], "other_id": b["id"], "preferred": b["id"]})
        assert ok.status_code == 200, ok.text
        assert c.post("/v1/feedback", json={"id": "cmpl-missing", "rating": 1}).status_code == 404
        assert c.post("/v1/feedback", json={"id": a["id"], "rating": "x"}).status_code == 400
        wrong = c.post("/v1/feedback", json={"id": a["id"], "other_id": None, "preferred": a["id"]})
        assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "other_id"  # a type, not a 404
        both = {"id": a["id"], "other_id": b["id"], "preferred": b["id"], "rating": 1}
        assert c.post("/v1/feedback", json=both).status_code == 400  # the rating would be dropped
    from tandem.serve.feedback import export_preferences

    out = tmp_path / "prefs.jsonl"
    assert len(export_preferences(server.state.settings.feedback_db, out)) == 1
    row = json.loads(out.read_text())
    assert row == {"prompt": "2+2=", "chosen": b["choices"][0]["text"], "rejected": a["choices"][0]["text"]}


def test_two_choices_of_one_response_make_a_pair(server, tmp_path):
    """The side-by-side preference UI: one request with ``n: 2``, the user picks one; ``preferred`` is the
    better choice's index. Pairing a choice with itself, or naming the winner by id, is a 400."""
    with server.client() as c:
        for seed in range(20):  # two different texts are needed: sample until the choices differ
            r = c.post(
                "/v1/completions", json={"prompt": "3+4=", "max_tokens": 3, "n": 2, "seed": seed}
            ).json()
            texts = [ch["text"] for ch in sorted(r["choices"], key=lambda ch: ch["index"])]
            if texts[0] != texts[1]:
                break
        rid = r["id"]
        bad = [
            ({"id": rid, "other_index": 0, "preferred": 0}, "other_index"),  # itself
            ({"id": rid, "other_index": 2, "preferred": 0}, "other_index"),  # no such choice
            ({"id": rid, "other_index": 1, "preferred": rid}, "preferred"),  # an id names both
            ({"id": rid, "other_index": 1, "preferred": True}, "preferred"),
            ({"id": rid, "other_index": 1, "preferred": 1, "rating": 1}, "rating"),
        ]
        for body, param in bad:
            wrong = c.post("/v1/feedback", json=body)
            assert wrong.status_code == 400 and wrong.json()["error"]["param"] == param, (body, wrong.text)
        ok = c.post("/v1/feedback", json={"id": rid, "index": 0, "other_index": 1, "preferred": 1})
        assert ok.status_code == 200, ok.text
    row = server.state.feedback.rows()[-1]
    assert (row["response_id"], row["choice_index"], row["other_id"], row["other_index"]) == (rid, 0, rid, 1)
    assert (row["chosen"], row["rejected"]) == (texts[1], texts[0])
    from tandem.serve.feedback import export_preferences

    out = tmp_path / "prefs.jsonl"
    export_preferences(server.state.settings.feedback_db, out)
    assert {"prompt": "3+4=", "chosen": texts[1], "rejected": texts[0]} in map(
        json.loads, out.read_text().splitlines()
    )


def test_not_ready_is_503(server):
    server.state.ready = False
    try:
        with server.client() as c:
            r = c.post("/v1/completions", json={"prompt": "1"})
            assert c.get("/ready").status_code == 503 and c.get("/health").status_code == 200
    finally:
        server.state.ready = True
    assert r.status_code == 503 and r.json()["error"]["code"] == "not_ready"


def test_full_queue_is_429(tiny_model_dir):
    settings = ServeSettings(max_batch_size=1, max_wait_ms=0, max_queue=1, max_tokens_limit=64)
    running = Running(build_state({"main": str(tiny_model_dir)}, settings, name="tiny"))

    async def burst():
        async with httpx.AsyncClient(base_url=running.url, timeout=60) as c:
            body = {"prompt": "1", "max_tokens": 64, "temperature": 1.0}
            return await asyncio.gather(*(c.post("/v1/completions", json=body) for _ in range(8)))

    try:
        responses = asyncio.run(burst())
    finally:
        running.stop()
    codes = sorted(r.status_code for r in responses)
    assert 200 in codes and 429 in codes and set(codes) <= {200, 429}
    limited = next(r for r in responses if r.status_code == 429)
    assert limited.json()["error"]["type"] == "rate_limit_error"
