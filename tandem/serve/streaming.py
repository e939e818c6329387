"""Server-sent events of the completions and chat endpoints.

Per choice, in order: its opening chunks (chat: ``delta.role``; ``echo``: the prompt), one chunk per
text delta (with the log-probs of the tokens whose text it carries), then its finish chunk (empty text or
delta, ``finish_reason`` set). After every choice: the usage chunk when ``stream_options.include_usage``,
then a single ``data: [DONE]``. Text that could still turn out to be the start of a stop string is held
back until it cannot; the tokens of a stop string that is cut are not reported.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import AsyncIterator, Awaitable
from typing import Any

from tandem.serve.decode import PromptScores, RowResult, StreamEvent, TokenLogprob
from tandem.serve.logprobs import text_starts
from tandem.serve.shapes import ChatShape, CompletionShape, usage


def event(payload: dict) -> bytes:
    """One SSE ``data:`` line."""
    return f"data: {json.dumps(payload)}\n\n".encode()


async def _events(job: Any) -> AsyncIterator[StreamEvent]:
    """A streaming job's events until its end marker (None); nothing for a cached result."""
    if job is None:
        return
    while (item := await job.tokens.get()) is not None:
        yield item


class _Choice:
    """The streaming state of one choice: tokens so far, where their texts start, what was sent."""

    def __init__(self, stops: list[str], base: int) -> None:
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.stops, self.base = stops, base
        self.ids: list[int] = []
        self.entries: list[TokenLogprob] = []
        self.starts: list[int] = []
        self.sent, self.reported, self.length = "", 0, 0

    def add(self, token: TokenLogprob, text: str) -> str | None:
        """Record ``token`` (``text``: all tokens decoded); the new safe text to send, or None.

        Safe is the text before the first stop string once one has appeared (the row ends there, and
        the non-streamed answer is cut there too), else all but the last ``hold`` characters: those
        may still be the start of a stop string that the next tokens complete."""
        self.ids.append(token.token)
        self.entries.append(token)
        self.starts.append(self.length)
        self.length = len(text)
        cuts = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        if cuts:
            safe = text[: min(cuts)]
        else:
            safe = text[: max(len(self.sent), len(text) - self.hold)]
        return safe if len(safe) > len(self.sent) else None

    def take(self, upto_text: int | None = None, upto_tokens: int | None = None) -> tuple:
        """The unsent tokens up to those whose text starts before ``upto_text`` (or up to index
        ``upto_tokens``): ``(ids, entries, offsets)``; marks them sent."""
        end = bisect.bisect_left(self.starts, upto_text) if upto_tokens is None else upto_tokens
        end = max(end, self.reported)
        part = slice(self.reported, end)
        self.reported = end
        offsets = [self.base + s for s in self.starts[part]]
        return self.ids[part], self.entries[part], offsets


async def _choice(
    shape: CompletionShape | ChatShape,
    index: int,
    prompt: int,
    cached: RowResult | None,
    job: Any,
    stops: list[str],
    scores: dict[int, list],
) -> AsyncIterator[tuple[bytes | None, RowResult | None]]:
    """The chunks of one choice; the last item carries its result."""
    tokenizer = shape.tokenizer
    events = _events(job)
    first = None
    if getattr(shape, "echo", False) and shape.logprobs and prompt not in scores:
        first = cached.prompt_logprobs if cached is not None else await anext(events, None)
        if isinstance(first, PromptScores):
            scores[prompt], first = first.entries, None
        elif isinstance(first, list):
            scores[prompt], first = first, None
    for chunk in shape.opening(index, prompt, scores.get(prompt)):
        yield event(chunk), None
    state = _Choice(stops, len(shape.prefix(prompt)))

    async def tokens() -> AsyncIterator[StreamEvent]:
        if first is not None:
            yield first
        async for item in events:
            yield item

    async for item in tokens():
        if isinstance(item, PromptScores):
            continue
        safe = state.add(item, tokenizer.decode(state.ids + [item.token], skip_special_tokens=True))
        if safe is not None:
            ids, entries, offsets = state.take(upto_text=len(safe))
            yield event(shape.delta(index, safe[len(state.sent) :], ids, entries, offsets)), None
            state.sent = safe
    result = cached if cached is not None else await job.future
    if cached is not None:
        state.ids, state.entries = list(result.token_ids), list(result.logprobs)
        state.starts = text_starts(tokenizer, state.ids)
    keep = len(shape.reported(result)[0]) if shape.logprobs else state.reported
    rest = result.text[len(state.sent) :] if result.text.startswith(state.sent) else ""
    if rest or keep > state.reported:
        ids, entries, offsets = state.take(upto_tokens=keep)
        yield event(shape.delta(index, rest, ids, entries, offsets)), None
    yield event(shape.finish(index, result.finish_reason)), result


async def sse(
    shape: CompletionShape | ChatShape,
    pending: list[tuple[RowResult | None, Any]],
    per_prompt: int,
    prompt_ids: list[list[int]],
    stops: list[str],
    on_close: Any,
) -> AsyncIterator[bytes]:
    """The event stream of ``pending`` (per choice: a cached result or the batcher job generating it;
    choice ``i`` answers prompt ``i // per_prompt``). ``on_close()`` runs however the stream ends
    (finished, or the client went away): it cancels rows still generating."""
    results: list[RowResult] = []
    scores: dict[int, list] = {}
    try:
        for index, (cached, job) in enumerate(pending):
            async for chunk, result in _choice(shape, index, index // per_prompt, cached, job, stops, scores):
                if chunk is not None:
                    yield chunk
                if result is not None:
                    results.append(result)
        if shape.include_usage:
            yield event(shape.usage_chunk(usage(prompt_ids, results)))
        yield b"data: [DONE]\n\n"
    finally:
        on_close()


async def buffered_sse(
    shape: ChatShape, results: Awaitable[list[RowResult]], prompt_ids: list[list[int]], on_close: Any
) -> AsyncIterator[bytes]:
    """The event stream of a chat answer with tools: the whole answer is awaited first (a call can only
    be told from text once it is complete), then each choice is sent as :meth:`ChatShape.whole` chunks,
    the usage chunk when asked, and ``[DONE]``. ``on_close()`` runs however the stream ends."""
    try:
        done = await results
        for index, result in enumerate(done):
            for chunk in shape.whole(index, result):
                yield event(chunk)
        if shape.include_usage:
            yield event(shape.usage_chunk(usage(prompt_ids, done)))
        yield b"data: [DONE]\n\n"
    finally:
        on_close()
