"""Streamed answers equal the non-streamed ones: text that may still become a stop string is held back
until it cannot (a stop string, or its start, is never sent), and the tokens and log-probs reported in
the chunks are those of the whole answer."""

from __future__ import annotations

import json

import pytest
from bigram_models import answer_chain, bigram_model

pytest.importorskip("fastapi")

from fastapi.testclient import TestClient  # noqa: E402

from tandem.serve.server import build_state, make_app  # noqa: E402
from tandem.serve.state import ServeSettings  # noqa: E402

# after "a" (completions) or ":" (the end of a template-less chat prompt) the model spells "bcdef", then EOS
STOPS = [["cd"], ["d"], ["bcde"], ["zz"], ["cx", "de"], ["f"], ["ef", "c"]]


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    folder = bigram_model(
        tmp_path_factory.mktemp("chain") / "m", {"a": "b", ":": "b", **answer_chain("bcdef")}
    )
    state = build_state({"main": str(folder)}, ServeSettings(cache_size=0), name="chain")
    with TestClient(make_app(state)) as client:
        yield client


def _chunks(client: TestClient, path: str, body: dict) -> list[dict]:
    with client.stream("POST", path, json={**body, "stream": True}) as response:
        assert response.status_code == 200
        lines = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


@pytest.mark.parametrize("stop", STOPS)
def test_streamed_completion_equals_the_plain_one(client, stop):
    body = {"prompt": "a", "max_tokens": 8, "temperature": 0, "stop": stop, "logprobs": 1}
    plain = client.post("/v1/completions", json=body).json()["choices"][0]
    if stop == ["zz"]:
        assert plain["text"] == "bcdef"  # the chain runs (no stop string in it)
    chunks = [c["choices"][0] for c in _chunks(client, "/v1/completions", body)]
    assert "".join(c["text"] for c in chunks) == plain["text"]
    streamed = [c["logprobs"] for c in chunks if c["logprobs"]]
    for key in ("tokens", "token_logprobs", "text_offset"):
        assert [v for lp in streamed for v in lp[key]] == plain["logprobs"][key], key
    assert [c["finish_reason"] for c in chunks if c["finish_reason"]] == [plain["finish_reason"]]


@pytest.mark.parametrize("stop", STOPS)
def test_streamed_chat_equals_the_plain_one(client, stop):
    body = {
        "messages": [{"role": "user", "content": "a"}],
        "max_tokens": 8,
        "temperature": 0,
        "stop": stop,
        "logprobs": True,
    }
    plain = client.post("/v1/chat/completions", json=body).json()["choices"][0]
    if stop == ["zz"]:
        assert plain["message"]["content"] == "bcdef"  # the chain runs (no stop string in it)
    chunks = [c["choices"][0] for c in _chunks(client, "/v1/chat/completions", body) if c["choices"]]
    assert "".join(c["delta"].get("content") or "" for c in chunks) == plain["message"]["content"]
    streamed = [e for c in chunks if c.get("logprobs") for e in c["logprobs"]["content"]]
    assert streamed == plain["logprobs"]["content"]
    assert [c["finish_reason"] for c in chunks if c["finish_reason"]] == [plain["finish_reason"]]


def test_the_start_of_a_stop_string_is_never_sent(client):
    """The reported case: the stop string's first character arrives a token before its last."""
    body = {"prompt": "a", "max_tokens": 8, "temperature": 0, "stop": ["cd"], "logprobs": 0}
    chunks = [c["choices"][0] for c in _chunks(client, "/v1/completions", body)]
    assert [c["text"] for c in chunks if c["text"]] == ["b"]
    assert [t for c in chunks if c["logprobs"] for t in c["logprobs"]["tokens"]] == ["b"]
