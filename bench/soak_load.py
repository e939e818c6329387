"""Steady mixed client load for `bench/soak.py`: the request catalogue and the closed-loop clients.

Each client loops until a deadline (or a stop event) and picks one request kind at random by weight:
sampled, greedy (cache), chat, n>1, stop strings, prompt lists, seeded, SSE streams (completions and
chat, read to ``[DONE]``), dropped streams (closed after the first event), dropped requests (client
timeout), feedback (ratings and pairs, when the server has a feedback db), invalid requests (400/401/404)
and light GETs. Every outcome is counted as (kind, status or exception name); an outcome is *expected*
when the kind lists it, otherwise it is a 5xx, a connection error or an unexpected status.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx

PROMPTS = [f"{a}+{b}=" for a in (3, 17, 42, 88) for b in (5, 26, 61)]
INVALID = [  # (path, body or raw bytes, headers override, expected status)
    ("/v1/completions", {"prompt": "1+1=", "temperature": 5}, None, 400),
    ("/v1/completions", {"prompt": "1+1=", "n": 100}, None, 400),
    ("/v1/completions", {"max_tokens": 4}, None, 400),
    ("/v1/completions", b"{not json", None, 400),
    ("/v1/completions", {"prompt": "1+1=", "max_tokens": 10**6}, None, 400),
    ("/v1/completions", {"prompt": 7}, None, 400),
    ("/v1/completions", {"prompt": "1+1=", "model": "no-such-model"}, None, 404),
    ("/v1/chat/completions", {"messages": "hi"}, None, 400),
    ("/v1/completions", {"prompt": "1+1="}, {"Authorization": "Bearer wrong-key"}, 401),
    ("/v1/feedback", {"id": "cmpl-does-not-exist", "rating": 1}, None, 404),
]


@dataclass
class LoadState:
    """Shared between clients: outcome counts, latencies and remembered response ids per prompt."""

    feedback: bool
    counts: Counter = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    ids: dict[str, list[str]] = field(default_factory=dict)

    def remember(self, prompt: str, rid: str) -> None:
        kept = self.ids.setdefault(prompt, [])
        kept.append(rid)
        del kept[:-4]  # bounded: the load generator must not grow either


def _completion(prompt: str, **extra) -> dict:
    return {"prompt": prompt, "max_tokens": 12, "temperature": 0.8, **extra}


def _chat(prompt: str, **extra) -> dict:
    return {"messages": [{"role": "user", "content": prompt}], "max_tokens": 12, "temperature": 0.8, **extra}


async def _post_json(http, path, body, expect_choices, state, kind, prompt=None) -> str:
    r = await http.post(path, json=body)
    if r.status_code != 200:
        return str(r.status_code)
    data = r.json()
    if len(data.get("choices", [])) != expect_choices:
        return "bad-body"
    if prompt is not None and state.feedback:
        state.remember(prompt, data["id"])
    return "200"


async def _stream(http, path, body, drop: bool) -> str:
    async with http.stream("POST", path, json=body) as r:
        if r.status_code != 200:
            await r.aread()
            return str(r.status_code)
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if drop:
                return "dropped"  # leaving the block closes the connection mid-stream
            if line == "data: [DONE]":
                return "200"
            json.loads(line[len("data: ") :])
    return "no-done"


async def _drop(http, prompt: str) -> str:
    """A request the client abandons after 50 ms: the server must cancel its rows."""
    try:
        r = await http.post("/v1/completions", json=_completion(prompt), timeout=0.05)
        return str(r.status_code) if r.status_code != 200 else "200"
    except httpx.TimeoutException:
        return "dropped"


async def _feedback(http, rng: random.Random, state: LoadState) -> str:
    pairs = [(p, ids) for p, ids in state.ids.items() if len(ids) >= 2]
    if not pairs:
        return "skipped"
    prompt, ids = rng.choice(pairs)
    a, b = rng.sample(ids, 2)
    if rng.random() < 0.5:
        body = {"id": a, "rating": rng.choice([-1, 1])}
    else:
        body = {"id": a, "other_id": b, "preferred": rng.choice([a, b])}
    r = await http.post("/v1/feedback", json=body)
    return str(r.status_code)


async def _invalid(http, rng: random.Random) -> tuple[str, set[str]]:
    path, body, headers, status = rng.choice(INVALID)
    if isinstance(body, bytes):
        r = await http.post(path, content=body, headers={"content-type": "application/json"})
    else:
        r = await http.post(path, json=body, headers=headers)
    return str(r.status_code), {str(status)}


async def one_request(kind: str, http, rng: random.Random, state: LoadState) -> tuple[str, set[str]]:
    """Send one request of ``kind``; returns (outcome, expected outcomes)."""
    p = rng.choice(PROMPTS)
    ok = {"200"}
    if kind == "completion":
        return await _post_json(http, "/v1/completions", _completion(p), 1, state, kind, p), ok
    if kind == "greedy":
        return await _post_json(http, "/v1/completions", _completion(p, temperature=0), 1, state, kind), ok
    if kind == "chat":
        return await _post_json(http, "/v1/chat/completions", _chat(p), 1, state, kind), ok
    if kind == "n4":
        return await _post_json(http, "/v1/completions", _completion(p, n=4), 4, state, kind), ok
    if kind == "stop":
        body = _completion(p, stop=["\n", "1", "=="])
        return await _post_json(http, "/v1/completions", body, 1, state, kind), ok
    if kind == "prompt-list":
        body = _completion([p, rng.choice(PROMPTS), rng.choice(PROMPTS)])
        return await _post_json(http, "/v1/completions", body, 3, state, kind), ok
    if kind == "seeded":
        body = _completion(p, seed=rng.randrange(2**31))
        return await _post_json(http, "/v1/completions", body, 1, state, kind), ok
    if kind == "stream":
        return await _stream(http, "/v1/completions", _completion(p, stream=True), drop=False), ok
    if kind == "stream-chat":
        return await _stream(http, "/v1/chat/completions", _chat(p, stream=True), drop=False), ok
    if kind == "stream-drop":
        return await _stream(http, "/v1/completions", _completion(p, stream=True), drop=True), {"dropped"}
    if kind == "drop":
        return await _drop(http, p), {"dropped", "200"}
    if kind == "feedback":
        return await _feedback(http, rng, state), {"200", "skipped"}
    if kind == "invalid":
        return await _invalid(http, rng)
    if kind == "predict":
        r = await http.post("/predict", json={"text": p, "max_tokens": 8})
        return str(r.status_code), ok
    if kind == "get":
        path = rng.choice(["/v1/models", "/metrics", "/health", "/ready"])
        return str((await http.get(path)).status_code), ok
    raise ValueError(f"unknown request kind {kind!r}")


WEIGHTS = {
    "completion": 10,
    "greedy": 3,
    "chat": 5,
    "n4": 3,
    "stop": 3,
    "prompt-list": 2,
    "seeded": 2,
    "stream": 5,
    "stream-chat": 3,
    "stream-drop": 2,
    "drop": 1,
    "feedback": 3,
    "invalid": 4,
    "predict": 2,
    "get": 2,
}


def classify(outcome: str, expected: set[str]) -> str:
    """``ok``, ``5xx``, ``connection`` (transport error) or ``unexpected`` for one outcome."""
    if outcome in expected:
        return "ok"
    if outcome.isdigit() and int(outcome) >= 500:
        return "5xx"
    if outcome.startswith("exc:"):
        return "connection"
    return "unexpected"


async def client(i: int, http, state: LoadState, stop_at: float, stop: asyncio.Event, seed: int) -> None:
    """One closed-loop client: pick a kind, send, count, think 0-50 ms, until ``stop_at`` or ``stop``."""
    rng = random.Random(seed * 1000 + i)
    kinds = [k for k in WEIGHTS if state.feedback or k != "feedback"]
    weights = [WEIGHTS[k] for k in kinds]
    while time.monotonic() < stop_at and not stop.is_set():
        kind = rng.choices(kinds, weights)[0]
        started = time.monotonic()
        try:
            outcome, expected = await one_request(kind, http, rng, state)
        except httpx.HTTPError as err:
            outcome, expected = f"exc:{type(err).__name__}", set()
        state.counts[(kind, outcome, classify(outcome, expected))] += 1
        if outcome == "200":
            state.latencies.append(time.monotonic() - started)
            del state.latencies[:-10000]
        await asyncio.sleep(rng.uniform(0.0, 0.05))


async def drive(url: str, api_key: str, clients: int, seconds: float, feedback: bool, alive, seed: int):
    """Run ``clients`` clients against ``url`` for ``seconds``; stop early once ``alive()`` is False."""
    state = LoadState(feedback=feedback)
    stop = asyncio.Event()
    limits = httpx.Limits(max_connections=clients + 4)
    headers = {"Authorization": f"Bearer {api_key}"}
    stop_at = time.monotonic() + seconds

    async def watchdog() -> None:
        while time.monotonic() < stop_at and not stop.is_set():
            if not alive():
                stop.set()
            await asyncio.sleep(1.0)

    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits, headers=headers) as http:
        tasks = [client(i, http, state, stop_at, stop, seed) for i in range(clients)]
        await asyncio.gather(watchdog(), *tasks)
    return state
