"""HTTP routes: OpenAI completions and chat (plain and SSE), models, health, readiness, metrics, predict.

A request becomes one :class:`~tandem.serve.decode.RowRequest` per (prompt, sample); rows are validated
(token limits, context length) before anything is queued, greedy rows are answered from the arm's LRU
cache when possible, and the rest go to the arm's dynamic batcher.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from tandem.errors import ConfigError
from tandem.rollout.base import SamplingParams
from tandem.serve.app import ServerState, check_user_key, metrics_text
from tandem.serve.batcher import QueueFullError
from tandem.serve.cache import cache_key
from tandem.serve.decode import RowRequest, RowResult
from tandem.serve.protocol import ApiError, ChatRequest, CompletionRequest, PredictRequest, _Request
from tandem.serve.router import Arm


@dataclass
class Plan:
    """The rows of one request: prompt texts, their token ids, sampling params, arm, cancel flag."""

    arm: Arm
    texts: list[str]
    ids: list[list[int]]
    params: SamplingParams
    n: int
    cancel: threading.Event


def _pick_arm(state: ServerState, req: _Request, request: Request) -> Arm:
    if not state.ready or not state.router.arms:
        raise ApiError(503, "model is not loaded yet", type="service_unavailable", code="not_ready")
    forced = None
    if req.model is not None and req.model != state.name:
        if req.model not in state.router.arms:
            raise ApiError(
                404,
                f"model '{req.model}' not found; served: {state.name}",
                param="model",
                code="model_not_found",
            )
        forced = req.model
    user = req.user or request.headers.get("x-tandem-user")
    return state.router.pick(user, forced)


def plan_request(state: ServerState, req: _Request, texts: list[str], request: Request) -> Plan:
    """Validate limits and build the rows' shared sampling parameters; 400 on any violation."""
    s = state.settings
    max_tokens = req.max_tokens or 16
    if max_tokens > s.max_tokens_limit:
        raise ApiError(
            400, f"max_tokens={max_tokens} exceeds the limit {s.max_tokens_limit}", param="max_tokens"
        )
    if req.n > s.max_n:
        raise ApiError(400, f"n={req.n} exceeds the limit {s.max_n}", param="n")
    if len(texts) > s.max_prompts:
        raise ApiError(400, f"{len(texts)} prompts exceed the limit {s.max_prompts}", param="prompt")
    arm = _pick_arm(state, req, request)
    ids = []
    for i, text in enumerate(texts):
        tokens = arm.model.encode(text)
        if not tokens:
            raise ApiError(400, f"prompt {i} is empty", param="prompt")
        if len(tokens) + max_tokens > arm.model.context_length:
            raise ApiError(
                400,
                f"prompt {i} has {len(tokens)} tokens; with max_tokens={max_tokens} it exceeds "
                f"the context length {arm.model.context_length}",
                param="prompt",
                code="context_length_exceeded",
            )
        ids.append(tokens)
    try:
        params = SamplingParams(
            max_new_tokens=max_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            stop=req.stop_list(),
            seed=req.seed,
        )
    except ConfigError as err:
        raise ApiError(400, str(err)) from err
    return Plan(arm, texts, ids, params, req.n, threading.Event())


def _row(plan: Plan, prompt: int, sample: int) -> RowRequest:
    params = plan.params
    if params.seed is not None and sample:
        params = SamplingParams(**{**params.__dict__, "seed": params.seed + sample})
    return RowRequest(plan.ids[prompt], params, cancelled=plan.cancel.is_set)


def _submit(state: ServerState, plan: Plan, stream: bool) -> list[tuple[RowResult | None, object]]:
    """Per row: a cached result, or the batcher job generating it. 429 when the queue is full."""
    out = []
    for p in range(len(plan.ids)):
        key = cache_key(plan.arm.model.version, plan.ids[p], plan.params.max_new_tokens, plan.params.stop)
        for j in range(plan.n):
            cached = plan.arm.cache.get(key) if plan.params.greedy else None
            state.metrics.inc(
                "cache_lookups_total",
                1,
                "Greedy cache lookups.",
                arm=plan.arm.name,
                result="hit" if cached else ("miss" if plan.params.greedy else "skip"),
            )
            if cached is not None:
                out.append((cached, None))
                continue
            try:
                out.append((None, plan.arm.batcher.submit(_row(plan, p, j), stream=stream)))
            except QueueFullError as err:
                plan.cancel.set()
                raise ApiError(
                    429, f"{err}; retry later", type="rate_limit_error", code="queue_full"
                ) from err
    return out


async def _wait_all(plan: Plan, pending: list, request: Request) -> list[RowResult]:
    """Wait for every row; a client that disconnects cancels its rows (dropped from the batch)."""
    futures = [job.future for cached, job in pending if job is not None]
    while futures and not all(f.done() for f in futures):
        await asyncio.wait(futures, timeout=0.25)
        if await request.is_disconnected():
            plan.cancel.set()
            await asyncio.wait(futures)
    results = []
    for p, (cached, job) in enumerate(pending):
        result = cached if cached is not None else job.future.result()
        if cached is None and plan.params.greedy and result.finish_reason != "cancelled":
            prompt = p // plan.n
            key = cache_key(
                plan.arm.model.version, plan.ids[prompt], plan.params.max_new_tokens, plan.params.stop
            )
            plan.arm.cache.put(key, result)
        results.append(result)
    return results


def _usage(plan: Plan, results: list[RowResult]) -> dict:
    prompt = sum(len(ids) for ids in plan.ids) * plan.n
    completion = sum(len(r.token_ids) for r in results)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


async def _sse(plan: Plan, pending: list, chunk, state: ServerState) -> AsyncIterator[bytes]:
    """Server-sent events: one chunk per text delta, then a finish chunk per row, then ``[DONE]``.
    Text that could still turn out to be the start of a stop string is held back until it cannot."""
    hold = max((len(s) for s in plan.params.stop), default=1) - 1
    tokenizer = plan.arm.model.tokenizer
    try:
        for index, (cached, job) in enumerate(pending):
            sent = ""
            if job is not None:
                ids: list[int] = []
                while (token := await job.tokens.get()) is not None:
                    ids.append(token)
                    text = tokenizer.decode(ids, skip_special_tokens=True)
                    safe = text[: max(len(sent), len(text) - hold)] if hold else text
                    if len(safe) > len(sent) and not any(s in safe for s in plan.params.stop):
                        yield _event(chunk(index, safe[len(sent) :], None))
                        sent = safe
            result = cached if cached is not None else await job.future
            if result.text.startswith(sent) and len(result.text) > len(sent):
                yield _event(chunk(index, result.text[len(sent) :], None))
            yield _event(chunk(index, "", result.finish_reason))
        yield b"data: [DONE]\n\n"
    finally:
        plan.cancel.set()  # client went away (or we finished): drop any rows still generating


def _event(payload: dict) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


async def _completions(state: ServerState, req: CompletionRequest, request: Request):
    check_user_key(state, request)
    plan = plan_request(state, req, req.prompts(), request)
    pending = _submit(state, plan, req.stream)
    rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
    model = state.name

    def chunk(index: int, text: str, finish: str | None) -> dict:
        return {
            "id": rid,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [{"index": index, "text": text, "logprobs": None, "finish_reason": finish}],
        }

    def choice(i: int, r: RowResult) -> dict:
        return {"index": i, "text": r.text, "logprobs": None, "finish_reason": r.finish_reason}

    envelope = {"id": rid, "object": "text_completion", "created": created, "model": model}
    return await _respond(state, plan, pending, request, req.stream, chunk, choice, envelope)


async def _chat(state: ServerState, req: ChatRequest, request: Request):
    check_user_key(state, request)
    if req.max_completion_tokens is not None:
        req.max_tokens = req.max_completion_tokens
    if req.max_tokens is None:
        req.max_tokens = 16
    arm_probe = _pick_arm(state, req, request)
    text = arm_probe.model.render_chat([m.model_dump() for m in req.messages])
    plan = plan_request(state, req, [text], request)
    pending = _submit(state, plan, req.stream)
    rid, created, model = f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), state.name

    def chunk(index: int, delta: str, finish: str | None) -> dict:
        body = {"content": delta} if delta else {}
        if finish is None and not delta:
            body = {"role": "assistant", "content": ""}
        return {
            "id": rid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": index, "delta": body, "logprobs": None, "finish_reason": finish}],
        }

    def choice(i: int, r: RowResult) -> dict:
        message = {"role": "assistant", "content": r.text}
        return {"index": i, "message": message, "logprobs": None, "finish_reason": r.finish_reason}

    envelope = {"id": rid, "object": "chat.completion", "created": created, "model": model}
    return await _respond(state, plan, pending, request, req.stream, chunk, choice, envelope)


async def _respond(state, plan, pending, request, stream: bool, chunk, choice, envelope: dict):
    """The shared tail of the completions and chat endpoints: an SSE stream of ``chunk``s, or one JSON
    body of ``envelope`` + ``choice`` per result + usage; the answers are remembered for feedback."""
    headers = {"x-tandem-arm": plan.arm.name}
    if stream:
        return StreamingResponse(
            _sse(plan, pending, chunk, state), media_type="text/event-stream", headers=headers
        )
    results = await _wait_all(plan, pending, request)
    body = {
        **envelope,
        "choices": [choice(i, r) for i, r in enumerate(results)],
        "usage": _usage(plan, results),
        "system_fingerprint": plan.arm.model.version,
    }
    _remember(state, envelope["id"], plan, results)
    return JSONResponse(body, headers=headers)


def _remember(state: ServerState, rid: str, plan: Plan, results: list[RowResult]) -> None:
    """Keep the prompt and responses of ``rid`` so feedback can refer to it."""
    if state.feedback is not None:
        prompts = [plan.texts[i // plan.n] for i in range(len(results))]
        state.feedback.remember(rid, plan.arm.name, prompts, [r.text for r in results])


async def _parse(request: Request, model: type[_Request] | type[PredictRequest]):
    """Parse the JSON body into ``model``; 400 naming the field on any problem."""
    from fastapi.exceptions import RequestValidationError
    from pydantic import ValidationError

    raw = await request.body()
    try:
        data = json.loads(raw or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ApiError(400, f"body is not valid JSON: {err}", code="json_invalid") from err
    if not isinstance(data, dict):
        raise ApiError(400, "body must be a JSON object", code="invalid_body")
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise RequestValidationError(err.errors()) from err


async def _parse_dict(request: Request) -> dict:
    raw = await request.body()
    try:
        data = json.loads(raw or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ApiError(400, f"body is not valid JSON: {err}", code="json_invalid") from err
    if not isinstance(data, dict):
        raise ApiError(400, "body must be a JSON object", code="invalid_body")
    return data


def _feedback(state: ServerState, data: dict) -> dict:
    """``{"id", "rating", "index"?}`` rates one completion; ``{"id", "other_id", "preferred"}`` picks the
    better of two completions (``preferred`` is one of the two ids). Stored durably before answering."""
    if state.feedback is None:
        raise ApiError(
            404, "feedback is disabled (start the server with --feedback-db)", code="feedback_disabled"
        )
    rid = data.get("id")
    if not isinstance(rid, str):
        raise ApiError(400, "field 'id' (a response id) must be a string", param="id")
    found = state.feedback.lookup(rid)
    if found is None:
        raise ApiError(404, f"unknown response id '{rid}'", param="id", code="response_not_found")
    arm, prompts, texts = found
    index = data.get("index", 0)
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(texts):
        raise ApiError(400, f"'index' must be an integer in [0, {len(texts)})", param="index")
    common = {"response_id": rid, "prompt": prompts[index], "arm": arm, "choice_index": index}
    if "other_id" in data:
        other = data.get("other_id")
        other_found = state.feedback.lookup(other) if isinstance(other, str) else None
        if other_found is None:
            raise ApiError(404, f"unknown response id '{other}'", param="other_id", code="response_not_found")
        if other_found[1][0] != prompts[index]:
            raise ApiError(400, "the two responses answer different prompts", param="other_id")
        preferred = data.get("preferred")
        if preferred not in (rid, other):
            raise ApiError(400, "'preferred' must equal 'id' or 'other_id'", param="preferred")
        mine, theirs = texts[index], other_found[2][0]
        chosen, rejected = (mine, theirs) if preferred == rid else (theirs, mine)
        row = state.feedback.add(
            **common, other_id=other, preferred=preferred, chosen=chosen, rejected=rejected
        )
    else:
        rating = data.get("rating")
        if not isinstance(rating, (int, float)) or isinstance(rating, bool):
            raise ApiError(400, "'rating' must be a number (or send other_id + preferred)", param="rating")
        row = state.feedback.add(**common, rating=float(rating), chosen=texts[index])
    state.metrics.inc("feedback_total", 1, "Feedback rows stored.", arm=arm)
    return {"id": row, "object": "feedback", "stored": True}


def register_routes(app: FastAPI, state: ServerState) -> None:
    """Attach every public route to ``app``."""

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await _completions(state, await _parse(request, CompletionRequest), request)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await _chat(state, await _parse(request, ChatRequest), request)

    @app.post("/predict")
    async def predict(request: Request):
        check_user_key(state, request)
        body = await _parse(request, PredictRequest)
        req = CompletionRequest(prompt=body.text, max_tokens=body.max_tokens, temperature=0.0)
        plan = plan_request(state, req, [body.text], request)
        result = (await _wait_all(plan, _submit(state, plan, False), request))[0]
        return JSONResponse(
            {"text": body.text, "completion": result.text, "finish_reason": result.finish_reason},
            headers={"x-tandem-arm": plan.arm.name},
        )

    @app.get("/v1/models")
    async def models(request: Request):
        check_user_key(state, request)
        data = [{"id": state.name, "object": "model", "created": int(state.started), "owned_by": "tandem"}]
        data += [
            {
                "id": name,
                "object": "model",
                "created": int(state.started),
                "owned_by": "tandem",
                "root": str(arm.model.folder),
                "version": arm.model.version,
                "format": arm.model.format,
            }
            for name, arm in state.router.arms.items()
        ]
        return {"object": "list", "data": data}

    @app.get("/health")
    async def health():
        return {"status": "ok", "pid": os.getpid()}

    @app.get("/ready")
    async def ready():
        if not state.ready:
            raise ApiError(503, "model is not loaded yet", type="service_unavailable", code="not_ready")
        return {"status": "ready", "arms": dict(state.router.split)}

    @app.get("/metrics")
    async def metrics(request: Request):
        check_user_key(state, request)
        return metrics_text(state)

    @app.post("/v1/feedback")
    async def feedback(request: Request):
        check_user_key(state, request)
        return _feedback(state, await _parse_dict(request))

    from tandem.serve.admin import register_admin

    register_admin(app, state)
