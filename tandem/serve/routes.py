"""HTTP routes: OpenAI completions and chat (plain and SSE), models, health, readiness, metrics, predict.

A request becomes one :class:`~tandem.serve.decode.RowRequest` per (prompt, sample); rows are validated
(token limits, context length, token ids, ``logit_bias`` ids) before anything is queued, greedy rows
without log-probs, bias or penalties are answered from the arm's LRU cache when possible, and the rest go
to the arm's dynamic batcher. Bodies and chunks are built by :mod:`tandem.serve.shapes`, streams by
:mod:`tandem.serve.streaming`.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from tandem.errors import ConfigError
from tandem.rollout.base import SamplingParams
from tandem.serve.app import (
    BodyResponse,
    check_user_key,
    header,
    metrics_text,
    parse_json_object,
    read_body,
)
from tandem.serve.batcher import QueueFullError
from tandem.serve.cache import cache_key
from tandem.serve.decode import RowRequest, RowResult
from tandem.serve.engines import check_request
from tandem.serve.feedback import Conversation
from tandem.serve.feedback_route import store_feedback
from tandem.serve.model import ServedModel
from tandem.serve.protocol import ApiError, ChatRequest, CompletionRequest, GenerationRequest, PredictRequest
from tandem.serve.router import Arm
from tandem.serve.shapes import ChatShape, CompletionShape, Shape, usage
from tandem.serve.state import ServerState
from tandem.serve.streaming import buffered_sse, sse
from tandem.serve.tools import chat_tools, template_messages, uses_tools


@dataclass
class Options:
    """What every row of a request asks beyond its :class:`SamplingParams`."""

    top_logprobs: int | None = None  # None: no log-probs in the answer; else alternatives per token
    echo: bool = False
    logit_bias: dict[int, float] = field(default_factory=dict)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    @classmethod
    def of(cls, req: GenerationRequest, top_logprobs: int | None, echo: bool = False) -> Options:
        """The options of ``req``."""
        return cls(top_logprobs, echo, req.bias_ids(), req.presence_penalty, req.frequency_penalty)

    def cacheable(self, params: SamplingParams) -> bool:
        """Whether rows may be answered from (and stored in) the greedy cache, whose key holds only the
        prompt, token limit and stop strings."""
        plain = self.top_logprobs is None and not self.logit_bias
        penalised = self.presence_penalty or self.frequency_penalty or params.penalised
        return params.greedy and plain and not penalised


class CancelFlag:
    """A request's cancel flag: set on the event loop, read by the generation thread between steps. A
    plain attribute (one write, reads that may see it a step late, as with an Event) where a
    ``threading.Event`` would build a lock and a condition per request (about 3 us of the loop's CPU)."""

    __slots__ = ("_set",)

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set


def response_id() -> str:
    """32 hex digits of a random version-4 UUID, as ``uuid.uuid4().hex`` (a third of its CPU)."""
    raw = bytearray(os.urandom(16))
    raw[6] = raw[6] & 0x0F | 0x40  # version 4
    raw[8] = raw[8] & 0x3F | 0x80  # RFC 4122 variant
    return raw.hex()


@dataclass
class Plan:
    """The rows of one request: prompt texts and token ids, sampling params, how many rows per prompt
    are generated (``samples``: ``best_of``) and returned (``n``), arm, options, cancel flag."""

    arm: Arm
    texts: list[str]
    ids: list[list[int]]
    params: SamplingParams
    n: int
    cancel: CancelFlag
    samples: int = 1
    options: Options = field(default_factory=Options)
    token_prompts: list[bool] = field(default_factory=list)


def _pick_arm(state: ServerState, req: GenerationRequest, request: Request) -> Arm:
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
    user = req.user or header(request, b"x-tandem-user")
    return state.router.pick(user, forced)


def vocab_size(model: ServedModel) -> int:
    """Token ids a request may name: those both the tokenizer and the model's embedding know."""
    return model.vocab_size


def _prompt_ids(model: ServedModel, prompt: str | list[int], i: int, vocab: int) -> list[int]:
    """Token ids of prompt ``i`` (a text, encoded with special tokens, or ids checked against the vocab)."""
    if isinstance(prompt, str):
        tokens = model.encode(prompt)
        if not tokens:
            raise ApiError(400, f"prompt {i} is empty", param="prompt")
        return tokens
    for token in prompt:
        if not 0 <= token < vocab:
            raise ApiError(
                400, f"prompt {i}: token id {token} is outside the vocabulary [0, {vocab})", param="prompt"
            )
    return list(prompt)


def _check_bias(bias: dict[int, float], vocab: int) -> None:
    for token in bias:
        if not 0 <= token < vocab:
            raise ApiError(
                400, f"logit_bias token id {token} is outside the vocabulary [0, {vocab})", param="logit_bias"
            )


def _token_limit(state: ServerState, arm: Arm, ids: list[list[int]], max_tokens: int | None) -> int:
    """``max_tokens``, or (None) the rest of the context after the longest prompt, capped by
    ``--max-tokens-limit``; 400 when a prompt leaves no room for it."""
    cap, context = state.settings.max_tokens_limit, arm.model.context_length
    limit = max_tokens if max_tokens is not None else max(1, min(cap, context - max(map(len, ids))))
    for i, tokens in enumerate(ids):
        if len(tokens) + limit > context:
            raise ApiError(
                400,
                f"prompt {i} has {len(tokens)} tokens; with max_tokens={limit} it exceeds "
                f"the context length {context}",
                param="prompt",
                code="context_length_exceeded",
            )
    return limit


def plan_request(
    state: ServerState,
    req: GenerationRequest,
    prompts: list[str | list[int]],
    request: Request,
    *,
    max_tokens: int | None,
    options: Options | None = None,
    arm: Arm | None = None,
) -> Plan:
    """Validate limits and build the rows' shared sampling parameters; 400 on any violation.
    ``max_tokens`` None: the rest of the context (capped by ``--max-tokens-limit``)."""
    s, options = state.settings, options or Options()
    if max_tokens is not None and max_tokens > s.max_tokens_limit:
        raise ApiError(
            400, f"max_tokens={max_tokens} exceeds the limit {s.max_tokens_limit}", param="max_tokens"
        )
    best_of = getattr(req, "best_of", None)
    samples = best_of or req.n
    if samples > s.max_n:
        name = "best_of" if best_of else "n"
        raise ApiError(400, f"{name}={samples} exceeds the limit {s.max_n}", param=name)
    if len(prompts) > s.max_prompts:
        raise ApiError(400, f"{len(prompts)} prompts exceed the limit {s.max_prompts}", param="prompt")
    arm = arm or _pick_arm(state, req, request)
    check_request(
        arm.through_engine,
        token_prompts=any(not isinstance(p, str) for p in prompts),
        top_logprobs=options.top_logprobs or 0,
        prompt_logprobs=options.echo and options.top_logprobs is not None,
        logit_bias=bool(options.logit_bias),
        penalties=bool(options.presence_penalty or options.frequency_penalty),
    )
    vocab = vocab_size(arm.model)
    _check_bias(options.logit_bias, vocab)
    ids = [_prompt_ids(arm.model, prompt, i, vocab) for i, prompt in enumerate(prompts)]
    texts = [
        p if isinstance(p, str) else arm.model.tokenizer.decode(t) for p, t in zip(prompts, ids, strict=True)
    ]
    try:
        params = SamplingParams(
            max_new_tokens=_token_limit(state, arm, ids, max_tokens),
            temperature=req.effective_temperature(),
            top_p=req.top_p,
            top_k=max(req.top_k, 0),
            min_p=req.min_p,
            repetition_penalty=req.repetition_penalty,
            stop=req.stop_list(),
            seed=req.seed,
        )
    except ConfigError as err:
        raise ApiError(400, str(err)) from err
    tokens = [not isinstance(p, str) for p in prompts]
    return Plan(arm, texts, ids, params, req.n, CancelFlag(), samples, options, tokens)


def _row(plan: Plan, prompt: int, sample: int) -> RowRequest:
    params, o = plan.params, plan.options
    if params.seed is not None and sample:
        params = SamplingParams(**{**params.__dict__, "seed": params.seed + sample})
    return RowRequest(
        plan.ids[prompt],
        params,
        cancelled=plan.cancel.is_set,
        top_logprobs=o.top_logprobs or 0,
        prompt_logprobs=o.echo and o.top_logprobs is not None and sample == 0,
        logit_bias=o.logit_bias,
        presence_penalty=o.presence_penalty,
        frequency_penalty=o.frequency_penalty,
        prompt_text=None if plan.token_prompts and plan.token_prompts[prompt] else plan.texts[prompt],
    )


def _key(plan: Plan, prompt: int) -> object:
    return cache_key(plan.arm.model.version, plan.ids[prompt], plan.params.max_new_tokens, plan.params.stop)


def _submit(state: ServerState, plan: Plan, stream: bool) -> list[tuple[RowResult | None, object]]:
    """Per row: a cached result, or the batcher job generating it. 429 when the queue is full."""
    out = []
    cacheable = plan.options.cacheable(plan.params)
    for p in range(len(plan.ids)):
        for j in range(plan.samples):
            cached = plan.arm.cache.get(_key(plan, p)) if cacheable else None
            state.metrics.inc(
                "cache_lookups_total",
                1,
                "Greedy cache lookups.",
                arm=plan.arm.name,
                result="hit" if cached else ("miss" if cacheable else "skip"),
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
    if futures and not all(f.done() for f in futures):
        await _until_done_or_gone(futures, request, plan.cancel)
    results = []
    cacheable = plan.options.cacheable(plan.params)
    for i, (cached, job) in enumerate(pending):
        result = cached if cached is not None else job.future.result()
        if cached is None and cacheable and result.finish_reason != "cancelled":
            plan.arm.cache.put(_key(plan, i // plan.samples), result)
        results.append(result)
    return results


async def _until_done_or_gone(futures: list, request: Request, cancel: CancelFlag) -> None:
    """Wait for ``futures``; if the client disconnects first, set ``cancel`` and still wait for them.

    The body has been read, so the request's next ASGI message is ``http.disconnect``: one task waits
    for it while the rows generate (naive equivalent: poll ``request.is_disconnected()`` every 0.25 s,
    about 0.1 ms of CPU per poll, paid by every queued request, more the further the server falls
    behind). A server that answers with another message falls back to that polling. ``rows`` is one
    plain future completed by the rows' done-callbacks, not a task running ``asyncio.wait`` (a task per
    request cost about 20 us of the event loop's CPU)."""
    rows = all_done(futures)
    listener = asyncio.ensure_future(request.receive())
    try:
        await asyncio.wait([rows, listener], return_when=asyncio.FIRST_COMPLETED)
        if rows.done():
            return
        message = listener.result() if listener.exception() is None else {}
        if message.get("type") == "http.disconnect":
            cancel.set()
            await rows
            return
        while not rows.done():  # not the ASGI servers Tandem runs under; kept correct anyway
            await asyncio.wait([rows], timeout=0.25)
            if await request.is_disconnected():
                cancel.set()
                await rows
    finally:
        listener.cancel()
        rows.cancel()


def all_done(futures: list) -> asyncio.Future:
    """A future that completes (with None) once every one of ``futures`` has; cancelling it leaves them."""
    done = asyncio.get_running_loop().create_future()
    left = [len(futures)]

    def one_done(_future) -> None:
        left[0] -= 1
        if not left[0] and not done.done():
            done.set_result(None)

    for future in futures:
        future.add_done_callback(one_done)
    return done


def _best(plan: Plan, results: list[RowResult]) -> list[tuple[int, RowResult]]:
    """``(prompt index, result)`` of each returned choice: with ``best_of``, the ``n`` rows of each
    prompt with the highest mean token log-prob (best first); otherwise every row in order."""
    out = []
    for p in range(len(plan.ids)):
        rows = results[p * plan.samples : (p + 1) * plan.samples]
        if plan.samples > plan.n:
            rows = sorted(rows, key=lambda r: -sum(e.logprob for e in r.logprobs) / max(1, len(r.logprobs)))
        out += [(p, r) for r in rows[: plan.n]]
    return out


async def _completions(state: ServerState, req: CompletionRequest, request: Request):
    check_user_key(state, request)
    req.check()
    options = Options.of(req, req.logprobs, echo=req.echo)
    plan = plan_request(state, req, req.prompts(), request, max_tokens=req.max_tokens, options=options)
    shape = CompletionShape(
        f"cmpl-{response_id()}",
        int(time.time()),
        state.name,
        plan.arm.model.version,
        plan.arm.model.tokenizer,
        logprobs=req.logprobs is not None,
        include_usage=req.include_usage(),
        echo=req.echo,
        prompt_texts=plan.texts,
        prompt_ids=plan.ids,
        token_prompts=plan.token_prompts,
    )
    return await _respond(state, plan, shape, request, req.stream)


async def _chat(state: ServerState, req: ChatRequest, request: Request):
    check_user_key(state, request)
    req.check()
    tools = chat_tools(req, state.settings.tool_format)
    arm = _pick_arm(state, req, request)
    messages = [m.for_template() for m in req.messages]
    if uses_tools(tools, messages):
        messages, decls = template_messages(arm.model.tokenizer, tools, messages)
        text = arm.model.render_chat(messages, decls) + tools.prefix()
    else:
        text = arm.model.render_chat(messages)
    top = (req.top_logprobs or 0) if req.logprobs else None
    plan = plan_request(
        state, req, [text], request, max_tokens=req.token_limit(), options=Options.of(req, top), arm=arm
    )
    shape = ChatShape(
        f"chatcmpl-{response_id()}",
        int(time.time()),
        state.name,
        plan.arm.model.version,
        plan.arm.model.tokenizer,
        logprobs=req.logprobs,
        include_usage=req.include_usage(),
        tools=tools,
    )
    record = ChatRecord([m.for_record() for m in req.messages], tools.declarations() if tools.active else [])
    return await _respond(state, plan, shape, request, req.stream, record)


async def _respond(
    state: ServerState,
    plan: Plan,
    shape: Shape,
    request: Request,
    stream: bool,
    record: ChatRecord | None = None,
):
    """The shared tail of the completions and chat endpoints: an SSE stream, or one JSON body with a
    choice per returned row and the usage; the answers (and a chat's conversation, ``record``) are
    remembered for feedback and export."""
    headers = {"x-tandem-arm": plan.arm.name}
    pending = _submit(state, plan, stream)
    if stream and isinstance(shape, ChatShape) and shape.tools.active:
        events = buffered_sse(shape, _wait_all(plan, pending, request), plan.ids, plan.cancel.set)
        events = _remembered(state, shape.rid, plan, pending, events, record, shape)
        return StreamingResponse(events, media_type="text/event-stream", headers=headers)
    if stream:
        events = sse(shape, pending, plan.n, plan.ids, plan.params.stop, plan.cancel.set)
        events = _remembered(state, shape.rid, plan, pending, events, record, shape)
        return StreamingResponse(events, media_type="text/event-stream", headers=headers)
    results = await _wait_all(plan, pending, request)
    chosen = _best(plan, results)
    scores = [results[p * plan.samples].prompt_logprobs for p in range(len(plan.ids))]
    choices = [shape.choice(i, p, r, scores[p]) for i, (p, r) in enumerate(chosen)]
    body = {**shape.envelope(False), "choices": choices, "usage": usage(plan.ids, results)}
    _remember(state, shape.rid, plan, [r for _, r in chosen], record, shape)
    return BodyResponse(body, headers)


def require_json(request: Request) -> None:
    """415 for a body declared as anything but JSON (a form-urlencoded body is not parsed as JSON);
    a body without a content-type is read as JSON."""
    declared = header(request, b"content-type")
    media = (declared or "").split(";")[0].strip().lower()
    if declared is not None and media != "application/json" and not media.endswith("+json"):
        raise ApiError(
            415,
            f"content-type '{media}' is not supported; send the body as application/json",
            code="unsupported_media_type",
        )


async def _remembered(
    state: ServerState,
    rid: str,
    plan: Plan,
    pending: list,
    events: AsyncIterator[bytes],
    record: ChatRecord | None,
    shape: Shape,
):
    """The ``events`` of a stream; its answers are remembered (for feedback) just before ``[DONE]``, so
    feedback sent as soon as the client sees the end finds them. A stream cut short is not stored."""
    async for chunk in events:
        if chunk.startswith(b"data: [DONE]"):
            results = [cached if cached is not None else job.future.result() for cached, job in pending]
            _remember(state, rid, plan, results, record, shape)
        yield chunk


@dataclass
class ChatRecord:
    """What a chat request records for export: its messages and tool declarations (OpenAI shapes)."""

    messages: list[dict]
    tools: list[dict]


def _remember(
    state: ServerState,
    rid: str,
    plan: Plan,
    results: list[RowResult],
    record: ChatRecord | None = None,
    shape: Shape | None = None,
) -> None:
    """Keep the prompt and responses of ``rid`` so feedback can refer to it; a chat's conversation too,
    with each choice's assistant message (tool calls included) and exact prompt and completion text."""
    if state.feedback is None:
        return
    prompts = [plan.texts[i // plan.n] for i in range(len(results))]
    conversation = None
    if record is not None and isinstance(shape, ChatShape):
        prefix = shape.tools.prefix()
        choices = []
        for r in results:
            message, finish = shape.message(r)
            choices.append({"message": message, "completion": prefix + r.text, "finish_reason": finish})
        prompt = plan.texts[0][: len(plan.texts[0]) - len(prefix)] if prefix else plan.texts[0]
        conversation = Conversation(prompt, record.messages, record.tools, choices)
    state.feedback.remember(rid, plan.arm.name, prompts, [r.text for r in results], conversation)


async def _parse(request: Request, model: type[GenerationRequest] | type[PredictRequest]):
    """Parse the JSON body into ``model``; 400 naming the field on any problem."""
    from fastapi.exceptions import RequestValidationError
    from pydantic import ValidationError

    data = parse_json_object(await read_body(request))
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise RequestValidationError(err.errors()) from err


async def _parse_dict(request: Request) -> dict:
    return parse_json_object(await request.body())


def generation_endpoints(state: ServerState) -> dict:
    """The generation endpoints by path (``POST``): registered as FastAPI routes and also dispatched
    directly, past the router (:mod:`tandem.serve.direct`). They take only the request."""

    async def completions(request: Request):
        require_json(request)
        return await _completions(state, await _parse(request, CompletionRequest), request)

    async def chat(request: Request):
        require_json(request)
        return await _chat(state, await _parse(request, ChatRequest), request)

    return {"/v1/completions": completions, "/v1/chat/completions": chat}


def register_routes(app: FastAPI, state: ServerState, endpoints: dict | None = None) -> None:
    """Attach every public route to ``app``; ``endpoints``: :func:`generation_endpoints`."""
    for path, endpoint in (endpoints or generation_endpoints(state)).items():
        app.post(path)(endpoint)

    @app.post("/predict")
    async def predict(request: Request):
        check_user_key(state, request)
        body = await _parse(request, PredictRequest)
        req = CompletionRequest(prompt=body.text, max_tokens=body.max_tokens, temperature=0.0)
        plan = plan_request(state, req, [body.text], request, max_tokens=body.max_tokens)
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
                "root": arm.model.label,
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
        return store_feedback(state, await _parse_dict(request))
