"""OpenAI response bodies and stream chunks of the completions and chat endpoints.

One :class:`CompletionShape` or :class:`ChatShape` per response holds what its bodies share (id, model,
fingerprint, whether log-probs and usage are reported) and builds the parts: a choice of the JSON body,
the opening chunks of a streamed choice (chat: ``delta.role``; completions with ``echo``: the prompt),
content chunks, the finish chunk (empty text / empty delta with ``finish_reason``) and the usage chunk
(``choices: []``) of ``stream_options.include_usage``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from transformers import PreTrainedTokenizerBase

from tandem.serve.decode import RowResult, TokenLogprob
from tandem.serve.logprobs import chat_logprobs, completion_logprobs, text_starts, visible_tokens
from tandem.serve.tools import ChatTools


def usage(prompt_ids: list[list[int]], results: list[RowResult]) -> dict:
    """OpenAI usage: each prompt counted once (however many choices it has), every generated token."""
    prompt = sum(len(ids) for ids in prompt_ids)
    completion = sum(len(r.token_ids) for r in results)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


@dataclass
class Shape:
    """What every body and chunk of one response shares."""

    rid: str
    created: int
    model: str
    fingerprint: str
    tokenizer: PreTrainedTokenizerBase
    logprobs: bool = False
    include_usage: bool = False
    body_object: str = ""
    chunk_object: str = ""

    def envelope(self, streamed: bool) -> dict:
        """The fields around ``choices`` (``usage: null`` on chunks when a usage chunk will follow)."""
        body = {
            "id": self.rid,
            "object": self.chunk_object if streamed else self.body_object,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.fingerprint,
        }
        return body | ({"usage": None} if streamed and self.include_usage else {})

    def chunk(self, choice: dict) -> dict:
        """A stream chunk with one choice."""
        return {**self.envelope(True), "choices": [choice]}

    def usage_chunk(self, counted: dict) -> dict:
        """The last chunk before ``[DONE]`` with ``include_usage``: no choices, the usage."""
        return {**self.envelope(True), "choices": [], "usage": counted}

    def reported(self, result: RowResult) -> tuple[list[int], list[TokenLogprob]]:
        """The generated tokens whose log-probs are reported (those of a cut stop string are not)."""
        keep = visible_tokens(self.tokenizer, result.token_ids, result.text)
        return result.token_ids[:keep], result.logprobs[:keep]


@dataclass
class CompletionShape(Shape):
    """Bodies and chunks of ``/v1/completions``; ``echo`` prefixes each choice with its prompt."""

    echo: bool = False
    prompt_texts: list[str] = field(default_factory=list)
    prompt_ids: list[list[int]] = field(default_factory=list)
    token_prompts: list[bool] = field(default_factory=list)  # given as ids: echoed with special tokens
    body_object: str = "text_completion"
    chunk_object: str = "text_completion"

    def prefix(self, prompt: int) -> str:
        """The echoed prompt text ('' without echo)."""
        return self.prompt_texts[prompt] if self.echo else ""

    def _logprobs(self, ids: list[int], entries: list, offsets: list[int]) -> dict | None:
        return completion_logprobs(self.tokenizer, ids, entries, offsets) if self.logprobs else None

    def _prompt_part(self, prompt: int, scores: list[TokenLogprob | None] | None) -> dict | None:
        ids = self.prompt_ids[prompt]
        if scores is None:
            scores = [None] * len(ids)
        starts = text_starts(self.tokenizer, ids, skip_special=not self.token_prompts[prompt])
        return self._logprobs(ids, scores, starts)

    def choice(self, index: int, prompt: int, result: RowResult, scores: list | None) -> dict:
        """One choice of the JSON body (``scores``: the prompt's log-probs, for echo)."""
        base = self.prefix(prompt)
        logprobs = None
        if self.logprobs:
            ids, entries = self.reported(result)
            offsets = [len(base) + s for s in text_starts(self.tokenizer, ids)]
            logprobs = self._logprobs(ids, entries, offsets)
            if self.echo:
                head = self._prompt_part(prompt, scores)
                logprobs = {key: head[key] + logprobs[key] for key in logprobs}
        return {
            "index": index,
            "text": base + result.text,
            "logprobs": logprobs,
            "finish_reason": result.finish_reason,
        }

    def opening(self, index: int, prompt: int, scores: list | None) -> list[dict]:
        """Chunks before a streamed choice's tokens: the echoed prompt."""
        if not self.echo:
            return []
        logprobs = self._prompt_part(prompt, scores) if self.logprobs else None
        return [
            self.chunk(
                {"index": index, "text": self.prefix(prompt), "logprobs": logprobs, "finish_reason": None}
            )
        ]

    def delta(self, index: int, text: str, ids: list[int], entries: list, offsets: list[int]) -> dict:
        """A content chunk: ``text`` and the log-probs of its tokens ``ids`` (texts at ``offsets``)."""
        logprobs = self._logprobs(ids, entries, offsets)
        return self.chunk({"index": index, "text": text, "logprobs": logprobs, "finish_reason": None})

    def finish(self, index: int, reason: str) -> dict:
        """The last chunk of a choice."""
        return self.chunk({"index": index, "text": "", "logprobs": None, "finish_reason": reason})


@dataclass
class ChatShape(Shape):
    """Bodies and chunks of ``/v1/chat/completions``; with active ``tools`` the text is parsed into
    ``tool_calls`` (:mod:`tandem.serve.tools`)."""

    body_object: str = "chat.completion"
    chunk_object: str = "chat.completion.chunk"
    tools: ChatTools = field(default_factory=ChatTools)

    def message(self, result: RowResult) -> tuple[dict, str]:
        """The assistant message of ``result`` and its finish reason (``tool_calls`` when it calls)."""
        message, calls = self.tools.message(result.text)
        return message, "tool_calls" if calls else result.finish_reason

    def prefix(self, prompt: int) -> str:
        """Chat never echoes."""
        return ""

    def choice(self, index: int, prompt: int, result: RowResult, scores: list | None) -> dict:
        """One choice of the JSON body."""
        logprobs = chat_logprobs(self.tokenizer, self.reported(result)[1]) if self.logprobs else None
        message, finish = self.message(result)
        return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish}

    def whole(self, index: int, result: RowResult) -> list[dict]:
        """A finished choice as stream chunks: role, content (with every log-prob), one delta per tool
        call (``index`` = its position, the whole arguments at once), then the finish chunk."""
        message, finish = self.message(result)
        logprobs = chat_logprobs(self.tokenizer, self.reported(result)[1]) if self.logprobs else None
        chunks = self.opening(index, 0, None)
        if message["content"] or logprobs is not None:
            delta = {"content": message["content"] or ""}
            chunks.append(
                self.chunk({"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": None})
            )
        for i, call in enumerate(message.get("tool_calls", [])):
            delta = {"tool_calls": [{"index": i, **call}]}
            chunks.append(
                self.chunk({"index": index, "delta": delta, "logprobs": None, "finish_reason": None})
            )
        return [*chunks, self.finish(index, finish)]

    def opening(self, index: int, prompt: int, scores: list | None) -> list[dict]:
        """The first chunk of a streamed choice says who speaks."""
        delta = {"role": "assistant", "content": ""}
        return [self.chunk({"index": index, "delta": delta, "logprobs": None, "finish_reason": None})]

    def delta(self, index: int, text: str, ids: list[int], entries: list, offsets: list[int]) -> dict:
        """A content chunk and the log-probs of its tokens."""
        logprobs = chat_logprobs(self.tokenizer, entries) if self.logprobs else None
        return self.chunk(
            {"index": index, "delta": {"content": text}, "logprobs": logprobs, "finish_reason": None}
        )

    def finish(self, index: int, reason: str) -> dict:
        """The last chunk of a choice: an empty delta with the finish reason."""
        return self.chunk({"index": index, "delta": {}, "logprobs": None, "finish_reason": reason})
