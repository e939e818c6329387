"""OpenAI ``logprobs`` objects from the decode loop's per-token log-probs.

The numbers are :class:`~tandem.serve.decode.TokenLogprob` entries: the log-prob of each token under the
distribution it was drawn from — ``log_softmax((logits + logit_bias - penalties) / temperature)``, raw
logits when greedy, *before* top-k/top-p truncation — which, without bias or penalties, are exactly the
behaviour log-probs training records (:func:`tandem.rollout.sampling.behaviour_logprobs`).

Two shapes: completions ``{tokens, token_logprobs, top_logprobs, text_offset}`` (``top_logprobs`` a
``{token text: log-prob}`` dict per position holding the alternatives plus the sampled token, so up to
``logprobs + 1`` entries), and chat ``{content: [{token, logprob, bytes, top_logprobs: [...]}]}`` with
exactly ``top_logprobs`` alternatives. A token's text is the token decoded alone (special tokens shown);
``text_offset`` is where the token's text starts in the returned text.
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from tandem.serve.decode import TokenLogprob

LOGPROB_FLOOR = -9999.0  # JSON has no -Infinity; a token the distribution rules out reports this


def token_texts(tokenizer: PreTrainedTokenizerBase, ids: list[int]) -> list[str]:
    """Each token decoded alone (special tokens kept, so EOS shows as e.g. ``</s>``)."""
    return tokenizer.batch_decode([[i] for i in ids], skip_special_tokens=False) if ids else []


def text_starts(tokenizer: PreTrainedTokenizerBase, ids: list[int], skip_special: bool = True) -> list[int]:
    """Where each token's text starts in ``decode(ids)``: ``len(decode(ids[:i]))`` for every ``i``."""
    if not ids:
        return []
    prefixes = tokenizer.batch_decode([ids[:i] for i in range(len(ids))], skip_special_tokens=skip_special)
    return [len(text) for text in prefixes]


def visible_tokens(tokenizer: PreTrainedTokenizerBase, ids: list[int], text: str) -> int:
    """How many of ``ids`` belong to ``text``: all of them, unless a stop string was cut from the text;
    then the tokens whose text starts before the cut (the stop string's own tokens are not reported)."""
    if tokenizer.decode(ids, skip_special_tokens=True) == text:
        return len(ids)
    return sum(1 for start in text_starts(tokenizer, ids) if start < len(text))


def _lp(value: float) -> float:
    return max(float(value), LOGPROB_FLOOR)


def completion_logprobs(
    tokenizer: PreTrainedTokenizerBase,
    ids: list[int],
    entries: list[TokenLogprob | None],
    offsets: list[int],
) -> dict:
    """The completions ``logprobs`` object of tokens ``ids`` with their ``entries`` (None: a prompt's
    first token, which has no log-prob) whose texts start at ``offsets`` in the returned text."""
    alt = iter(token_texts(tokenizer, [t for e in entries if e is not None for t, _ in e.top]))
    tokens = token_texts(tokenizer, ids)
    values: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    for text, entry in zip(tokens, entries, strict=True):
        if entry is None:
            values.append(None)
            tops.append(None)
            continue
        top = {next(alt): _lp(lp) for _, lp in entry.top}
        top.setdefault(text, _lp(entry.logprob))  # the sampled token is always listed
        values.append(_lp(entry.logprob))
        tops.append(top)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": list(offsets)}


def chat_logprobs(tokenizer: PreTrainedTokenizerBase, entries: list[TokenLogprob]) -> dict:
    """The chat ``logprobs`` object of generated tokens ``entries``."""
    texts = iter(token_texts(tokenizer, [e.token for e in entries]))
    alt = iter(token_texts(tokenizer, [t for e in entries for t, _ in e.top]))
    content = []
    for entry in entries:
        top = []
        for _, lp in entry.top:
            text = next(alt)
            top.append({"token": text, "logprob": _lp(lp), "bytes": list(text.encode("utf-8"))})
        text = next(texts)
        content.append(
            {
                "token": text,
                "logprob": _lp(entry.logprob),
                "bytes": list(text.encode("utf-8")),
                "top_logprobs": top,
            }
        )
    return {"content": content, "refusal": None}
